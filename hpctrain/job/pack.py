"""Several single-rank runs side by side in one task (``hydra.launcher.runs_per_task=k``).

The task (one Slurm array task, or one local job) runs :class:`PackJob`: it forks one child process
per sweep point of its pack, each running the same :class:`~hpctrain.job.wrapper.SweepJob`
a one-run task would, so each packed run keeps its own run dir, metrics, run record, retries and
preemption handling; its output goes to ``<run_dir>/.hpctrain/task.log``. Forked, not started afresh:
the heavy imports the task function's contract names in its ``preload`` (hpctrain's app: the trainer,
hence torch) are done once per task, before the fork, not once per run (torch's import alone is
1.3 s). Nothing touches CUDA before the fork: each child sets its own ``CUDA_VISIBLE_DEVICES`` first.

Placement (:func:`slots`): the task's GPUs (its ``CUDA_VISIBLE_DEVICES``) are dealt out round robin,
one device per run, several runs per GPU when k is larger than the GPU count; the task's CPUs (its
affinity mask) are split into k nearly equal shares, each run pinned to its share
(``sched_setaffinity``, ``OMP_NUM_THREADS``). ``hydra.launcher.gpu_memory_fraction`` caps each run's
share of its GPU's memory (``torch.cuda.set_per_process_memory_fraction``, set in the child).

Preemption: the signal (USR2) is taken by this parent, not by submitit's handler: it is passed on to
every child, whose trainer checkpoints at its next step boundary, records ``requeued`` and exits
with :data:`REQUEUE_EXIT`. Once every child has ended the parent hands the signal to submitit, which
requeues the task. A child still saving when :func:`checkpoint_wait_s` has passed (``signal_delay_s``
less a margin for the requeue itself) is killed and recorded ``requeued``: it resumes from its last
complete checkpoint, and one slow run does not cost the whole task its requeue. A requeued or retried
task runs again only the runs of its pack that have not ended (completed runs, and runs whose retries
are used up, are left alone). A SIGTERM is told apart by this parent (:func:`term_meaning_now`): for a
preemption's grace time it passes USR2 on as above; for Slurm's own requeue (no grace time, the SIGKILL
``KillWait`` later) too, but then it does not requeue the task again; the children leave SIGTERM to it.

Cancel: ``hpctrain cancel --run N`` of a packed run writes ``cancelled`` into that run's record and leaves
the task alone; the task reads its running runs' records every :data:`CANCEL_LOOK_S`, stops a cancelled
run's process and goes on with the others.

Runs of several ranks cannot be packed: the launcher refuses them before anything is submitted.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpctrain._compat.submitit import checkpoint_for_requeue, preemption_signal, private_pickles
from hpctrain.core import paths as runfiles
from hpctrain.core.app_contract import contract_of
from hpctrain.core.state import FINAL, State
from hpctrain.core.run import RunSpec
from hpctrain.job import lifecycle
from hpctrain.job.lifecycle import Lifecycle, Outcome
from hpctrain.job.preemption import (END_EXIT, TERM_BY_PARENT_ENV, RequeueFailed, Term, decides_term, ended_as,
                                     requeue_with, term_now)

private_pickles()  # the result pickle this job writes (the launcher reads it) not writable by the group

REQUEUE_EXIT = 75  # a child checkpointed on the preemption signal: requeue the task for it
MEMORY_FRACTION_ENV = "HPCTRAIN_GPU_MEMORY_FRACTION"
CANCEL_LOOK_S = 1.0  # how often the task reads its running runs' records for a cancel
REQUEUE_MARGIN_S = 10.0  # of signal_delay_s, kept for the requeue itself (records, submitit's pickle, scontrol)


def checkpoint_wait_s(signal_delay_s: float) -> float:
    """How long after the preemption signal the task waits for its runs' checkpoints: what is left of
    ``signal_delay_s`` once the requeue's margin (at most half of it) is set aside."""
    delay = max(0.0, float(signal_delay_s))
    return delay - min(REQUEUE_MARGIN_S, delay / 2)


def slots(k: int, gpus: Sequence[str], cpus: Sequence[int]) -> List[Tuple[Optional[str], List[int]]]:
    """For each of ``k`` runs: its GPU (or None on a CPU task) and its CPUs.

    GPUs round robin (run i on ``gpus[i % len(gpus)]``); CPUs split into k contiguous shares that
    differ by at most one; with fewer CPUs than runs, runs share CPUs round robin.
    """
    out = []
    cpus = list(cpus)
    for i in range(k):
        gpu = gpus[i % len(gpus)] if gpus else None
        if not cpus:
            share: List[int] = []
        elif len(cpus) >= k:
            lo, hi = i * len(cpus) // k, (i + 1) * len(cpus) // k
            share = cpus[lo:hi]
        else:
            share = [cpus[i % len(cpus)]]
        out.append((gpu, share))
    return out


def task_gpus() -> List[str]:
    """The devices this task may use, as its CUDA_VISIBLE_DEVICES names them (Slurm or the local launcher)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "NoDevFiles"]


def task_cpus() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS): no pinning
        return []


class PackJob:
    """The callable of a packed task: runs its points side by side, each in its own process."""

    def __init__(self, payload: str, sweep_dir: str, memory_fraction: Optional[float] = None, app: str = "",
                 signal_delay_s: float = 90.0) -> None:
        self.payload = payload
        self.sweep_dir = sweep_dir
        self.memory_fraction = memory_fraction
        self.app = app  # the task function's fingerprint, as SweepJob records it on completion
        self.signal_delay_s = signal_delay_s  # the launcher's: the signal comes this long before the time limit

    def __call__(self, points: List[Dict[str, Any]]) -> Dict[int, str]:
        """``points``: the pack's runs as the plan decided them (:meth:`RunSpec.to_json`)."""
        from hpctrain.core import events

        todo = []
        for point in points:
            spec = RunSpec.from_json(point, Path(self.sweep_dir))
            state = events.read(spec.run_dir).state
            if state in FINAL:  # completed, or ended for good: never run twice
                print(f"hpctrain pack: #{spec.idx} {spec.name} is {state}: not run again", flush=True)
            else:
                todo.append((spec, point))
        placed = slots(len(todo), task_gpus(), task_cpus())
        self._preload()
        signum = preemption_signal()
        submitit_handler = signal.getsignal(signum)
        preempted: List[float] = []  # when the signal came
        children: List[Tuple[RunSpec, int]] = []
        codes: Dict[int, int] = {}
        wait_s = checkpoint_wait_s(getattr(self, "signal_delay_s", 90.0))  # (a task pickled before it existed)

        def pass_on(sig: int, frame: Any) -> None:
            preempted.append(time.time())
            for spec, pid in children:
                if spec.idx not in codes:
                    os.kill(pid, sig)

        terms: List[float] = []  # SIGTERMs not yet told apart (a preemption's grace time, or a cancel)
        slurm_requeued = False  # Slurm requeued the task itself (preempted without grace time): no requeue of ours
        signal.signal(signum, pass_on)
        term_handler = signal.signal(signal.SIGTERM, lambda sig, frame: terms.append(time.time()))
        for (spec, point), (gpu, cpus) in zip(todo, placed):
            children.append((spec, self._fork(spec, point, gpu, cpus)))
            print(f"hpctrain pack: started #{spec.idx} {spec.name} (pid {children[-1][1]}, "
                  f"GPU {gpu if gpu is not None else '-'}, CPUs {_ranges(cpus)})", flush=True)
        cancelled: set = set()
        next_look = time.time() + CANCEL_LOOK_S
        while len(codes) < len(children):
            look = time.time() >= next_look  # `hpctrain cancel --run N` writes `cancelled` into run N's record
            if look:
                next_look = time.time() + CANCEL_LOOK_S
            if terms:
                terms.clear()
                meaning, job = term_now() if decides_term() and not preempted else (None, {})
                if meaning is Term.END:  # a cancel, the time limit: the runs end now, not at the SIGKILL
                    self._end_now([(spec, pid) for spec, pid in children if spec.idx not in codes], job)
                if meaning is Term.PREEMPTION:
                    print("hpctrain pack: SIGTERM with the job still running (a preemption's grace time): "
                          "the runs checkpoint as on the preemption signal", flush=True)
                if meaning in (Term.PREEMPTION, Term.REQUEUED):
                    slurm_requeued = meaning is Term.REQUEUED
                    pass_on(signum, None)
            late = bool(preempted) and time.time() >= preempted[0] + wait_s
            for spec, pid in children:
                idx, run_dir = spec.idx, spec.run_dir
                if idx in codes:
                    continue
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[idx] = os.waitstatus_to_exitcode(status)
                    print(f"hpctrain pack: #{idx} ended, exit code {codes[idx]}", flush=True)
                elif late:
                    codes[idx] = self._cut_short(spec, pid, wait_s)
                elif look and events.read(run_dir).state is State.CANCELLED:
                    os.kill(pid, signal.SIGKILL)  # cancelled: nothing to keep (submitit's children ignore SIGTERM)
                    cancelled.add(idx)
                    _note(run_dir, f"hpctrain pack: #{idx} {runfiles.PACKED_CANCELLED}: stopped pid {pid}")
                    print(f"hpctrain pack: #{idx} cancelled: stopped pid {pid}; the task's other runs go on",
                          flush=True)
            time.sleep(0.2)
        states = {spec.idx: str(events.read(spec.run_dir).state) for spec, _ in children}
        if any(c == REQUEUE_EXIT for c in codes.values()) and callable(submitit_handler):
            print(f"hpctrain pack: every run of the task has ended or checkpointed ({states}); requeueing", flush=True)
            try:
                if slurm_requeued:  # requeued already: submitit's checkpoint() and pickle, no scontrol requeue
                    checkpoint_for_requeue(submitit_handler)
                    sys.exit(0)
                requeue_with(submitit_handler, signum)  # submitit: checkpoint() below, scontrol requeue, exit
            except Exception as exc:  # the host side could not requeue, or submitit will not (max_num_timeout used up)
                for spec, _ in children:
                    if codes.get(spec.idx) == REQUEUE_EXIT:
                        # a requeue that failed is a failure (the retry budget decides), not a time-out
                        outcome = Outcome.FAILED if isinstance(exc, RequeueFailed) else Outcome.TIMED_OUT
                        Lifecycle(spec.run_dir).end(outcome, error=str(exc))
                raise
        signal.signal(signum, submitit_handler)
        signal.signal(signal.SIGTERM, term_handler)
        bad = {i: c for i, c in codes.items() if c not in (0, REQUEUE_EXIT) and i not in cancelled}
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(children)} packed run(s) failed (exit codes {bad}); "
                               f"their metrics.json hold the errors")
        return states

    @staticmethod
    def _end_now(running: List[Tuple[RunSpec, int]], job: Dict[str, str]) -> None:
        """The job ends (a SIGTERM that is no preemption): its running runs stop at once, each recorded as
        Slurm said the job ended (cancelled, timeout) where it said; never returns."""
        from hpctrain.core import events, summary

        end = ended_as(job)
        print(f"hpctrain pack: SIGTERM ends the job ({end or 'Slurm did not say why'}): stopping "
              f"{len(running)} run(s)", flush=True)
        for spec, pid in running:
            os.kill(pid, signal.SIGKILL)  # submitit's children ignore SIGTERM; nothing to keep
            os.waitpid(pid, 0)
            if events.read(spec.run_dir).final:  # `hpctrain cancel --run N` wrote it
                continue
            if end == "cancelled":
                events.cancelled(spec.run_dir, by="Slurm (scancel)", job_id=os.environ.get("SLURM_JOB_ID"))
            elif end == "timeout":
                events.timed_out(spec.run_dir, "the job reached its time limit (Slurm's SIGTERM) and was not requeued")
            if end is not None:
                summary.write(spec.run_dir)
        sys.exit(END_EXIT)

    def _cut_short(self, spec: RunSpec, pid: int, wait_s: float) -> int:
        """A run not checkpointed ``wait_s`` after the signal: killed so that the task still requeues; it
        resumes from its last complete checkpoint. Its exit code as the parent counts it."""
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        line = (f"hpctrain pack: #{spec.idx} {spec.name} cut short: not checkpointed {wait_s:.0f} s after the "
                f"preemption signal (signal_delay_s={getattr(self, 'signal_delay_s', 90.0):g} less the requeue's "
                f"margin); killed pid {pid}, it resumes from its last complete checkpoint")
        print(line, flush=True)
        _note(spec.run_dir, line)
        if not lifecycle.requeue(spec.run_dir, cut_short=True):  # it ended (completed, cancelled) meanwhile
            return 0
        return REQUEUE_EXIT

    def _preload(self) -> None:
        """Import once, before the fork, what the task function says its runs need."""
        import importlib

        import cloudpickle

        with open(self.payload, "rb") as f:
            task_function = cloudpickle.load(f)[1]
        for module in contract_of(task_function).preload:
            importlib.import_module(module)

    def _fork(self, spec: RunSpec, point: Dict[str, Any], gpu: Optional[str], cpus: List[int]) -> int:
        log = spec.run_dir / runfiles.PACKED_LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            os.close(fd)
            return pid
        code = 1
        try:  # the child: its devices, CPUs and output, then the run
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            if gpu is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            if cpus:
                os.environ["OMP_NUM_THREADS"] = str(len(cpus))
                os.sched_setaffinity(0, cpus)
            if self.memory_fraction:
                os.environ[MEMORY_FRACTION_ENV] = str(self.memory_fraction)
            code = child(self.payload, self.sweep_dir, json.dumps(point), self.app)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on requeue: the same pack again; its children recorded their own ``requeued``."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _note(run_dir: Path, line: str) -> None:
    """A line in the run's own log (``hpctrain cancel`` waits for it)."""
    try:
        with open(Path(run_dir) / runfiles.PACKED_LOG, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _ranges(cpus: List[int]) -> str:
    return ",".join(map(str, cpus)) if cpus else "-"


def child(payload: str, sweep_dir: str, point_json: str, app: str = "") -> int:
    """One packed run, in its own process: SweepJob as a one-run task would call it (``point_json``: the
    run's :meth:`RunSpec.to_json`)."""
    point = json.loads(point_json)
    spec = RunSpec.from_json(point, Path(sweep_dir))
    idx, run_dir = spec.idx, spec.run_dir
    signum = preemption_signal()

    def requeue(sig: int, frame: Any) -> None:
        """The trainer hands the signal here after its checkpoint (or it came before training began)."""
        if not lifecycle.requeue(run_dir):  # final (completed, cancelled): nothing to requeue, let it end
            return
        os._exit(REQUEUE_EXIT)

    signal.signal(signum, requeue)
    signal.signal(signal.SIGTERM, lambda sig, frame: None)  # the parent tells a SIGTERM apart, and passes USR2 on
    os.environ[TERM_BY_PARENT_ENV] = "1"
    fraction = os.environ.get(MEMORY_FRACTION_ENV)
    if fraction:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(float(fraction))
    from hpctrain.job.wrapper import SweepJob

    if "torch" in sys.modules:  # the threads torch may use: this run's share of the task's CPUs
        n = os.environ.get("OMP_NUM_THREADS")
        if n:
            sys.modules["torch"].set_num_threads(int(n))
    try:
        SweepJob(payload, sweep_dir, app)(point)
    except BaseException as exc:  # noqa: BLE001 - recorded by SweepJob's lifecycle; the exit code tells the parent
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        print(f"hpctrain pack: #{idx} failed: {exc!r}", file=sys.stderr, flush=True)
        return 1
    return 0


