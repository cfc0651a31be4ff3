"""A search worker: one task of the sweep's job array, running trial after trial until the study is done.

Rank 0 (the leader) claims each trial (:class:`hpctrain.search.leases.Leases`: facts gathered outside any
lock, a quick fenced decision under it; the study is told only while the lease is still its own),
announces it to the other ranks of its task (``<sweep>/.hpctrain/workers/<job id>.json``), runs it as a
run dir of the sweep with Hydra's ``run_job`` (as the launcher's job wrapper runs a sweep point), and
tells the study the objective. The other ranks run the same trial, the trainer's collectives keeping
them in step. It is a submitit checkpointable: on preemption or time limit the trainer checkpoints,
the task is requeued, and the leader takes back the same trial (its lease names this task) before
asking for another. A task that submitit does not requeue any more (out of ``max_num_timeout``) leaves
its checkpointed trial to the next worker (released, not failed) and stops, as does a leader too close
to its time limit to start a trial. A worker its launcher cancelled (Ctrl-C or SIGTERM on a local search,
:mod:`hpctrain.submit.interrupt`: its placeholder's record says ``cancelled``) is not requeued: its trial,
checkpointed, is recorded ``cancelled`` and released, and the same command again resumes it. Errors of the shared storage are retried on a freshly opened study.

With a scheduler (``asha``, ``hyperband``, ``pbt``) each assignment is a unit (:mod:`hpctrain.search.units`):
the bridge tells the app where to stop (``end_step``); after the unit the leader reports the objective at
that step and, before ``max_steps``, records the trial ``paused`` and marks its lease paused, then asks again
(waiting, uncapped, while other units run whose results may bring a promotion).
"""

import gc
import json
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import submitit
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobStatus, run_job
from omegaconf import OmegaConf, open_dict

from hpctrain._compat.hydra import stored_value
from hpctrain._compat.optuna import live_trial
from hpctrain.core import events, manifest, summary
from hpctrain.core.ports import MASTER_PORTS
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.run import RunSpec
from hpctrain.core.state import EventKind, State
from hpctrain.job import heartbeat, lifecycle, watchdog
from hpctrain.search import exploit
from hpctrain.search import study as studies
from hpctrain.search.claims import Heartbeat, alive_path
from hpctrain.search.leases import Assignment, Leases
from hpctrain.search.settings import Settings
from hpctrain.search.bridge import TrialBridge, activate
from hpctrain.search.compose import Composer
from hpctrain.search.space import trial_dirname
from hpctrain.search.units import Next, Unit, outcome
from hpctrain._compat.submitit import private_pickles

private_pickles()  # the result pickle this job writes (the launcher reads it) not writable by the group

POLL_S = 0.2
IDLE_S = 0.25  # between looks while running units may yet bring a promotion (a look is a few file reads)
WAIT_S = 5.0  # between looks while an owner's fate is unknown
WAIT_MAX_GRACES = 5  # a worker waits for unknown owners at most this many grace periods
INFRA_RETRIES = 3
INTERRUPTED = "interrupted"
HANG_INTERRUPT_S = 15.0  # a hung trial's ranks: this long to leave the trial before they are killed
_running: Dict[str, Any] = {}  # this process's current trial (run dir), for checkpoint()


class SearchWorker:
    def __init__(self, payload: str, sweep_dir: str, settings: Settings) -> None:
        self.payload = payload
        self.sweep_dir = sweep_dir
        self.settings = settings

    def __call__(self, worker: int, fixed: List[str], run_dir: Optional[str] = None) -> Dict[str, Any]:
        """One worker task. The launchers call every job as ``(index, overrides, run_dir)``; a worker's
        ``run_dir`` is its placeholder under ``.hpctrain/workers`` (each trial has a run dir of its own)."""
        env = submitit.JobEnvironment()
        self.placeholder = run_dir
        self.hydra_context, self.task_function, self.config = lifecycle.load_payload(self.payload)
        # what lives for the whole task (modules, the payload) out of the collector's full passes, which it
        # would walk again at every one of them, in a unit or between two
        gc.collect()
        gc.freeze()
        self.ranks = env.num_tasks
        if env.global_rank == 0:
            return self._lead(env, worker)
        return self._follow(env)

    # ------------------------------------------------------------------ rank 0
    def _lead(self, env: submitit.JobEnvironment, worker: int) -> Dict[str, Any]:
        me = str(env.job_id)
        sweep = self.sweep_dir
        self.worker = worker
        self.study = studies.open_study(sweep, self.settings, worker)
        owner = {"slurm_job_id": me if os.environ.get("SLURM_JOB_ID") else None, "worker": worker}
        leases = Leases(sweep, self.settings, me, owner)
        leases.end_hook = self._record_ended
        done: List[Dict[str, Any]] = []
        seq, waited, why = 0, 0.0, "no trial left"
        while True:
            if cancelled(self.placeholder):  # restarted after its launcher cancelled it: nothing more to run
                why = "cancelled by its launcher"
                break
            left = _time_left()
            if left is not None and left < self.settings.min_time_left_s:
                why = f"{left:.0f} s to its time limit: no new trial"
                break
            a = self._retrying("choosing a trial", lambda st: leases.next_trial(st))
            if a is Next.IDLE:
                time.sleep(IDLE_S)  # units run whose results may bring a promotion: look again
                continue
            if a is Next.WAIT and waited < WAIT_MAX_GRACES * self.settings.grace_s:
                time.sleep(WAIT_S)  # an owner's fate is unknown (the queue did not answer): look again
                waited += WAIT_S
                continue
            if isinstance(a, Assignment) and a.unit is not None and self.settings.scheduler == "pbt":
                # the exploit's copy of the donor's boundary and the lineage, before the other ranks hear of
                # the unit (they load what was copied)
                exploit.before(sweep, a.number, a.unit, a.params)
            seq += 1
            self._announce(me, seq, a if isinstance(a, Assignment) else None)
            if not isinstance(a, Assignment):
                break
            waited = 0.0
            unit = f" steps {a.unit.start_step}-{a.unit.end_step}" if a.unit is not None else ""
            print(f"hpctrain search: worker {worker} ({me}): trial {a.number} ({a.how}{unit}) {a.params}", flush=True)
            state, value = self._run(a, me, self.study, seq, leases)
            done.append({"trial": a.number, "state": state, "value": value})
            if state == INTERRUPTED:
                why = f"trial {a.number} interrupted by the time limit, left to the next worker"
                break
        print(f"hpctrain search: worker {worker} ({me}): {why}; ran {len(done)}", flush=True)
        return {"worker": worker, "trials": done}

    def _retrying(self, what: str, step: Callable[[Any], Any]) -> Any:
        """``step(study)``, again on a fresh study after an error of the shared storage (a torn journal,
        an NFS hiccup, a broken lock), a few times before giving up."""
        for attempt in range(INFRA_RETRIES + 1):
            try:
                return step(self.study)
            except (OSError, ValueError, RuntimeError) as exc:
                if attempt == INFRA_RETRIES:
                    raise
                print(f"hpctrain search: worker {self.worker}: {what}: {type(exc).__name__}: {exc}; "
                      f"retrying", flush=True)
                time.sleep(2 ** attempt)
                self.study = studies.open_study(self.sweep_dir, self.settings, self.worker)
        raise AssertionError("unreachable")

    def _announce(self, me: str, seq: int, a: Optional[Assignment]) -> None:
        """Tell this task's other ranks which trial comes next (or that none does)."""
        if self.ranks == 1:
            return  # no other rank reads it
        msg = {"attempt": _attempt(), "seq": seq, "stop": a is None}
        if a is not None:
            msg.update(number=a.number, trial_id=a.trial_id, params=a.params, how=a.how,
                       unit=a.unit.fields() if a.unit is not None else None, dir_params=a.dir_params)
        write_json_atomic(_announce_path(self.sweep_dir, me), msg)

    # ------------------------------------------------------------------ other ranks
    def _follow(self, env: submitit.JobEnvironment) -> Dict[str, Any]:
        me, last, ran = str(env.job_id), 0, 0
        while True:
            msg = read_json(_announce_path(self.sweep_dir, me))
            if not msg or msg.get("attempt") != _attempt() or int(msg.get("seq", 0)) <= last:
                time.sleep(POLL_S)
                continue
            last = int(msg["seq"])
            if msg.get("stop"):
                return {"rank": env.global_rank, "trials": ran}
            a = Assignment(int(msg["number"]), int(msg["trial_id"]), dict(msg["params"]), str(msg["how"]),
                                   unit=Unit.from_fields(msg["unit"]) if msg.get("unit") else None,
                                   dir_params=msg.get("dir_params"))
            self._run(a, me, None, last)
            ran += 1

    # ------------------------------------------------------------------ one trial
    def _run(self, a: Assignment, me: str, study: Any, seq: int,
             leases: Optional[Leases] = None) -> "tuple[Optional[State] | str, Optional[float]]":
        """Run one trial on this rank; on rank 0 (``study`` given) record and tell how it ended."""
        _fresh_rendezvous_port(seq)
        s, sweep = self.settings, self.sweep_dir
        overrides = s.space.overrides(a.params)
        dirname = trial_dirname(a.number, a.dir_params or a.params)
        run_dir = Path(sweep) / dirname
        if getattr(self, "composer", None) is None:
            self.composer = Composer(self.hydra_context.config_loader, self.config)
        config = self.composer(list(overrides))
        with open_dict(config):
            config.hydra.sweep.subdir = dirname
            config.hydra.job.num = a.number
            config.hydra.job.id = f"{me}_trial{a.number}"
        lead = study is not None
        # this trial's life: the leader records it (the trainer and the app ask for it), the other ranks none
        life = lifecycle.Lifecycle(run_dir, rank=0 if lead else 1, job_id=me, writes=lead)
        if lead:
            assert leases is not None
            _running["cancel"] = lambda: self._cancelled(a, leases, run_dir)
            self._register(a, dirname, overrides, life, app_max_steps(config))
        trial = live_trial(study, a.trial_id) if lead else None
        beat = Heartbeat(alive_path(sweep, a.number, me), s.heartbeat_s) if lead else None
        _running["run_dir"] = run_dir
        _running.pop("interrupted", None)
        end = a.unit.end_step if a.unit is not None and a.unit.end_step < int(s.max_steps or 0) else None
        bridge = TrialBridge(a.number, s.metric, trial, end=end, max_steps=s.max_steps, run_dir=str(run_dir))
        env = submitit.JobEnvironment()
        beats = heartbeat.dir_for(run_dir, f"{me}-{seq}")  # per unit: an ended unit's watchdog clears its own
        dog_settings = watchdog.settings_of(config, beats, run_dir, me, interrupt_s=HANG_INTERRUPT_S,
                                             nodes=env.num_nodes)  # the nodes' watchdogs make one decision
        dog = watchdog.start(dog_settings) if dog_settings is not None and env.local_rank == 0 else None
        if dog_settings is not None:
            os.environ[heartbeat.DIR_ENV] = str(beats)
        try:
            with activate(bridge), lifecycle.active(life):
                ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=config,
                              job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        finally:
            os.environ.pop(heartbeat.DIR_ENV, None)
            watchdog.stop(dog)
            _running.pop("run_dir", None)
            _running.pop("cancel", None)
            if beat is not None:
                beat.stop()
        if not lead:
            return None, None
        assert leases is not None
        if _running.pop("interrupted", False):  # checkpoint() ran and submitit did not requeue us
            if not self._retrying("releasing a trial", lambda st: leases.release(a)):
                print(f"hpctrain search: trial {a.number}: no longer ours to release", flush=True)
            return INTERRUPTED, None
        if a.unit is not None and s.scheduler == "pbt" and ret.status != JobStatus.FAILED:
            exploit.after_unit(run_dir, a.unit.end_step, int(s.max_steps or 0))  # kept before the trial pauses
        return self._settle(a, life, ret, bridge, leases)

    def _register(self, a: Assignment, dirname: str, overrides: List[str], life: lifecycle.Lifecycle,
                  max_steps: Optional[int]) -> None:
        """The trial as a run of the sweep (sweep.json, its record and events), for status and report."""
        sweep, me = Path(self.sweep_dir), life.job_id
        run_dir = sweep / dirname
        entry = manifest.RunEntry(RunSpec(a.number, tuple(overrides), run_dir.absolute(), max_steps), me,
                                  {"trial": a.number, "params": a.params})

        def add(m: manifest.Manifest) -> None:
            m.runs[a.number] = entry

        # a unit of a trial whose entry says the same already (this worker's earlier unit, the same params):
        # the locked rewrite would leave the same file
        written = ((read_json(SweepPaths(sweep).manifest) or {}).get("runs") or {}).get(str(a.number))
        if written != json.loads(json.dumps(entry.to_json(sweep), default=str)):
            manifest.update(sweep, add)
        if a.how == "new" or events.read(run_dir).state is State.CANCELLED:
            events.submitted(run_dir, trial=a.number)  # a cancelled trial taken again: a new submission of it
        unit = {"unit": a.unit.fields()} if a.unit is not None else {}
        life.begin(skip_completed=False, trial=a.number, how=a.how, **unit)
        if a.unit is not None:  # the rung (or interval) it runs to, for status and report's rung table
            summary.write(run_dir, trial=a.number, **self._stage(a.unit))

    def _settle(self, a: Assignment, life: lifecycle.Lifecycle, ret: Any, bridge: TrialBridge,
                leases: Leases) -> "tuple[State, Optional[float]]":
        """The trial's attempt ends through its lifecycle (once: a state the trainer decided, pruned, stands),
        then the study is told."""
        from optuna.trial import TrialState

        s, run_dir, Outcome = self.settings, life.run_dir, lifecycle.Outcome

        def tell(state: TrialState, value: Optional[float] = None) -> None:
            if not self._retrying("telling the study", lambda st: leases.commit(st, a, state, value)) \
                    and not leases.holds(a):
                print(f"hpctrain search: trial {a.number}: its lease passed to another worker; not told",
                      flush=True)
        result = stored_value(ret)
        if events.read(run_dir).state is State.HUNG:  # the watchdog ended it: retried from its checkpoint, or failed
            retry = events.retry_allowed(run_dir, s.max_adoptions - 1)
            if retry is not None and self._retrying("releasing a trial", lambda st: leases.release(a)):
                events.retrying(run_dir, retry, s.max_adoptions - 1)
                summary.write(run_dir)
                print(f"hpctrain search: trial {a.number} hung: released, retry {retry} of {s.max_adoptions - 1}",
                      flush=True)
                return State.RETRYING, None
            tell(TrialState.FAIL)
            summary.write(run_dir)
            return State.HUNG, None
        if ret.status == JobStatus.FAILED:
            error = "".join(traceback.format_exception(result))[-3000:] if isinstance(result, BaseException) else str(result)
            life.end(Outcome.FAILED, error=error, trial=a.number)
            tell(TrialState.FAIL)
            return State.FAILED, None
        if bridge.pruned_at is not None or life.ended is State.PRUNED \
                or (isinstance(result, dict) and State.parse(result.get("status")) is State.PRUNED):
            life.end(Outcome.PRUNED, step=bridge.pruned_at, reason="the pruner stopped it", trial=a.number)
            tell(TrialState.PRUNED)
            return State.PRUNED, None
        value = objective_value(result, run_dir, s.metric)
        fields: Dict[str, Any] = {"trial": a.number, "objective": {"metric": s.metric, "value": value}}
        if summary.read(run_dir) is None or not (summary.read(run_dir) or {}).get("metrics"):
            fields["metrics"] = summary.numbers(result)  # an app that writes no metrics.json of its own
        if value is None:
            life.end(Outcome.FAILED, error=f"no objective: the task function returned {str(result)[:200]!r} and "
                                           f"metrics.json has no {s.metric!r}", **fields)
            tell(TrialState.FAIL)
            return State.FAILED, None
        if a.unit is not None:  # the objective at the unit's end: the scheduler's rung value
            fields.update(self._stage(a.unit))
            at = dict((summary.read(run_dir) or {}).get("values_at") or {})
            fields["values_at"] = {**at, str(a.unit.end_step): value}  # the objective at each unit's end step
            self._retrying("reporting", lambda st: bridge.report(value, a.unit.end_step)  # type: ignore[union-attr]
                           if bridge.trial is not None else None)
            if outcome(a.unit, int(s.max_steps or 0)) is State.PAUSED:
                life.end(Outcome.PAUSED, step=a.unit.end_step, event={"index": a.unit.index}, **fields)
                if not self._retrying("pausing a trial", lambda st: leases.pause(a)):
                    print(f"hpctrain search: trial {a.number}: its lease passed to another worker; not paused",
                          flush=True)
                return State.PAUSED, value
        life.end(Outcome.COMPLETED, event={"value": value}, **fields)
        tell(TrialState.COMPLETE, value)
        return State.COMPLETED, value

    def _stage(self, unit: Unit) -> Dict[str, Any]:
        if self.settings.scheduler in ("asha", "hyperband"):
            return {"rung": unit.index, "bracket": unit.bracket}
        return {"interval": unit.index}

    def _record_ended(self, number: int, step: Optional[int], params: Dict[str, Any]) -> None:
        """The record of a paused trial the study ends (nothing will promote it): pruned at its rung, once."""
        run_dir = Path(self.sweep_dir) / trial_dirname(number, params)
        if events.read(run_dir).state is State.PRUNED:
            return
        lifecycle.Lifecycle(run_dir).end(lifecycle.Outcome.PRUNED, step=step, trial=number,
                                         reason="paused, never promoted: the study ended")

    def _cancelled(self, a: Assignment, leases: Leases, run_dir: Path) -> None:
        """Its launcher cancelled this worker during trial ``a`` (checkpointed by the trainer where it could be):
        the trial recorded ``cancelled`` and released, so the same command again resumes it, no adoption counted."""
        try:
            if not events.read(run_dir).final:
                events.cancelled(run_dir, by=cancelled_by(self.placeholder), job_id=leases.me)
            summary.write(run_dir)
        except OSError:
            pass
        if not self._retrying("releasing a trial", lambda st: leases.release(a)):
            print(f"hpctrain search: trial {a.number}: no longer ours to release", flush=True)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2 (rank 0): requeue this worker; it takes its trial back when it restarts
        (the trainer has checkpointed it). A worker its launcher cancelled lets its trial go and exits instead."""
        if cancelled(args[2] if len(args) > 2 else kwargs.get("run_dir")):
            stop = _running.pop("cancel", None)
            if stop is not None:
                stop()
            raise SystemExit(0)  # not requeued: submitit's local controller would start the worker again
        run_dir = _running.get("run_dir")
        if run_dir is not None:
            lifecycle.requeue(run_dir)
            _running["interrupted"] = True  # seen by _run only when submitit did not requeue (out of timeouts)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def cancelled(placeholder: Optional[str]) -> bool:
    """Whether the launcher cancelled the worker whose placeholder run dir this is."""
    try:
        return placeholder is not None and events.read(placeholder).state is State.CANCELLED
    except OSError:
        return False


def cancelled_by(placeholder: Optional[str]) -> str:
    """Who cancelled the worker, as its placeholder's record says (the launcher names the signal)."""
    found = [e for e in events.read(placeholder).events if e.kind is EventKind.CANCELLED] if placeholder else []
    return str(found[-1].data().get("by") or "its launcher") if found else "its launcher"


def objective_value(result: Any, run_dir: Path, metric: Optional[str]) -> Optional[float]:
    """The trial's objective: the task function's return value when it is a number, else its ``metric``
    entry (top level or under ``metrics``), else metrics.json's ``metrics[metric]``. NaN counts as none."""
    candidates: List[Any] = []
    numbers = summary.numbers(result)
    if "value" in numbers and len(numbers) == 1 and not isinstance(result, dict):
        candidates.append(numbers["value"])
    if metric:
        candidates.append(numbers.get(metric))
        candidates.append(((summary.read(run_dir) or {}).get("metrics") or {}).get(metric))
    for c in candidates:
        if isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(float(c)):
            return float(c)
    return None


def app_max_steps(config: Any) -> Optional[int]:
    """The trial's ``max_steps`` for its sweep.json entry; None for an app whose config has no such key
    (a struct config raises on a missing key: every worker died at its first trial)."""
    if "max_steps" not in config:
        return None
    if OmegaConf.is_interpolation(config, "max_steps"):  # it may read ${hydra:...}: this unit's, then
        HydraConfig.instance().set_config(config)  # (run_job sets it for the run in any case)
    return OmegaConf.select(config, "max_steps", default=None)


def _fresh_rendezvous_port(seq: int) -> None:
    """Every trial of this task after the first rendezvous on a port of its own (the ranks agree on ``seq``):
    a second ``init_process_group`` on the first trial's port, in the same processes, was seen to hang
    (gloo: "Timed out waiting 600000ms for send operation to complete")."""
    if "MASTER_PORT" not in os.environ:
        return  # the first trial: the trainer exports the job's port (distributed.job_master_port)
    base = int(os.environ.setdefault("HPCTRAIN_BASE_MASTER_PORT", os.environ["MASTER_PORT"]))
    os.environ["MASTER_PORT"] = str(MASTER_PORTS[(base - MASTER_PORTS.start + seq) % len(MASTER_PORTS)])


def _time_left() -> Optional[float]:
    """Seconds to this Slurm job's time limit (``SLURM_JOB_END_TIME``), None outside Slurm."""
    end = os.environ.get("SLURM_JOB_END_TIME")
    try:
        return float(end) - time.time() if end else None
    except ValueError:
        return None


def _attempt() -> str:
    """This attempt of the task (a requeue starts a new one): the ranks of one attempt agree on it."""
    return f"{os.environ.get('SLURM_JOB_ID', os.environ.get('SUBMITIT_LOCAL_JOB_ID', ''))}:" \
           f"{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _announce_path(sweep_dir: str, me: str) -> Path:
    return SweepPaths(sweep_dir).workers / f"{me}.json"
