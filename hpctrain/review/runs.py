"""One row per run of a sweep: its state from the run record, checked against the queue.

The run record (:mod:`hpctrain.core.events`) says what the run itself wrote: queued, running, requeued,
retrying, or how it ended. Slurm's word on a job that waits: held (it waits for a release, with Slurm's
reason), or requeued by Slurm itself (a node failure, ``scontrol requeue``: no word in the record). What the record cannot know, the queue tells: a run whose record is still
active but whose job has left the queue died without a word (killed, out of memory, a node lost), was
cancelled outside hpctrain, or hit its time limit; Slurm's logs, the job's result and ``sacct`` say
which. The queue is asked before the records are read, so a job that ends in between is seen ended.
A queue that cannot be asked is unknown: the record's word stands, with a warning.
"""

import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from hpctrain.core import events, summary
from hpctrain.core.paths import RunPaths, SweepPaths
from hpctrain.core.state import ACTIVE, FAILURES, FINAL, RESTING, EventKind, RunState, State
from hpctrain.review import checkpoints
from hpctrain.review import hardware as ran_on
from hpctrain.review import cost as costs
from hpctrain.review import jobs
from hpctrain.review import row_cache
from hpctrain.review import search as search_review
from hpctrain.review import stragglers as slow
from hpctrain.review.cost import Cost
from hpctrain.review.sweep import ListedRun, SweepListing, typed_value
from hpctrain.slurm import parse as slurm_parse
from hpctrain.slurm import query as slurm

STATES = tuple(State)  # the order counts are shown in
LAUNCHER_QUIET_S = 60.0  # a local sweep that wrote nothing for this long, with no run alive, has no launcher


@dataclass(frozen=True, repr=False)
class Run:
    """One run of a sweep as review knows it now: its record checked against the queue, its summary, its
    cost. Built once by :func:`collect`, never changed after: the one row type of ``status``, ``report``,
    ``cancel``, the tab and the Python API (``hpctrain.Run`` is this class)."""

    idx: int
    name: str
    values: Dict[str, str]  # swept values, as written in the overrides
    overrides: List[str]
    run_dir: Optional[Path]
    job_id: Optional[str]
    state: State
    note: str = ""  # why that state, when the queue or the job's files decided it
    step: Optional[int] = None
    max_steps: Optional[int] = None
    loss: Optional[float] = None  # the last train/loss
    elapsed_s: Optional[float] = None
    restarts: int = 0
    log: Optional[str] = None
    error: Optional[str] = None  # the traceback tail of a failed run
    metrics: Dict[str, Any] = field(default_factory=dict)
    declared_objective: Optional[Dict[str, str]] = None  # {"metric": NAME, "mode": "min"|"max"} as the run declares it
    objective: Optional[float] = None  # the value of the sweep's objective metric, where the run has it
    wall_s: float = 0.0  # the attempts' time by the run's own record
    attempts: int = 0
    utilisation: Dict[str, float] = field(default_factory=dict)  # what the job sampled (metrics.json "sys")
    stage: Optional[str] = None  # a search scheduler's trial: the rung (or PBT interval) it is at or runs to
    cost: Optional[Cost] = None  # GPU-, CPU-hours and wall time over all attempts
    # each requeue's (step it stopped at, step of the checkpoint it resumed from), None where not recorded
    requeue_steps: List[Tuple[Optional[int], Optional[int]]] = field(default_factory=list)
    # what its latest attempt ran on (hpctrain.job.hardware: node(s), GPU model, driver, CUDA, CPU model)
    hardware: Dict[str, Any] = field(default_factory=dict)
    # its latest attempt's ranks flagged as stragglers (hpctrain.job.straggler): rank, node, factor, step, since
    stragglers: List[Dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if type(self.state) is not State:  # a state given as its JSON text (an Enum call costs ~25 us a run)
            object.__setattr__(self, "state", State(self.state))

    def to_dict(self) -> Dict[str, Any]:
        """As ``status --json`` and results.json write a run: its fields by their names."""
        return asdict(self)

    @property
    def params(self) -> Dict[str, Any]:
        """The swept values, as numbers where they are numbers."""
        return {k: typed_value(v) for k, v in self.values.items()}

    @property
    def config(self) -> Any:
        """The run's composed config (its ``.hydra/config.yaml``) as an OmegaConf DictConfig; None before it exists."""
        if self.run_dir is None or not RunPaths(self.run_dir).hydra_config.is_file():
            return None
        from omegaconf import OmegaConf

        return OmegaConf.load(RunPaths(self.run_dir).hydra_config)

    @property
    def checkpoint(self) -> Optional[Path]:
        """The newest complete checkpoint (``last.pt``, else ``previous.pt``; a torn file is not); None without one."""
        return checkpoints.newest_complete(self.run_dir)

    @property
    def hosts(self) -> Dict[int, str]:
        """The node each rank of its latest attempt ran on (read when asked: a file per rank)."""
        world = (summary.read(self.run_dir) or {}).get("world_size") if self.run_dir else None
        return ran_on.hosts(self.run_dir, self.hardware, world if isinstance(world, int) else None)

    @property
    def hardware_by_attempt(self) -> List[Dict[str, Any]]:
        """Each attempt's hardware, oldest first, as its ``started`` recorded it (``{}`` where it did not)."""
        if self.run_dir is None:
            return []
        return [dict(e.data().get("hardware") or {}) for e in events.events(self.run_dir)
                if e.kind is EventKind.STARTED]

    @property
    def straggler(self) -> str:
        """Its stragglers in one line (``straggler: rank 1 on n2, 1.8x``); "" for none."""
        return slow.line(self.stragglers)

    def __repr__(self) -> str:
        metric = (self.declared_objective or {}).get("metric", "objective")
        shown = f"{metric}={self.objective:.4g}" if self.objective is not None else "no objective yet"
        step = f", step {self.step}/{self.max_steps}" if self.step is not None and self.max_steps else (
            f", step {self.step}" if self.step is not None else "")
        return f"Run({self.idx} {self.name!r}, {self.state.value}, {shown}{step})"


def state_counts(runs: Iterable[Any]) -> Dict[State, int]:
    """How many runs are in each state, in STATES order, states with none left out."""
    out = {s: 0 for s in STATES}
    for r in runs:
        out[r.state] += 1
    return {s: n for s, n in out.items() if n}


@dataclass(frozen=True)
class Snapshot:
    sweep: SweepListing
    runs: List[Run]
    warnings: List[str]
    taken: float
    dead_workers: List[str] = field(default_factory=list)  # a search's workers that died: one line each
    metric: Optional[str] = None  # the objective every run's ``objective`` is the value of

    def counts(self) -> Dict[State, int]:
        return state_counts(self.runs)

    def active(self) -> List[Run]:
        return [r for r in self.runs if r.state in ACTIVE]

    def objective(self) -> Optional[Dict[str, str]]:
        """The sweep's objective, as its runs declare it (the first run that has one)."""
        return next((r.declared_objective for r in self.runs if r.declared_objective), None)


class Accounting:
    """``sacct`` for the whole sweep: the final states, asked once and only when a run's state needs them
    (the queue and the files left it undecided); every attempt of every job (``-D``), asked once for the
    cost. Unknown (None) where accounting is off or failed, never "no cost"."""

    def __init__(self, job_ids: List[str]) -> None:
        self.job_ids = job_ids
        self._by_job: Optional[Dict[str, List[slurm_parse.Usage]]] = None
        self._states: Optional[Dict[str, str]] = None
        self.asked = False
        self.problems: List[str] = []
        self._asking: Optional[threading.Thread] = None
        self._answer: Any = None

    def prefetch(self) -> None:
        """Ask for the cost now, in a thread beside the queue's call and the files' reads (each row needs it:
        one wait for slurmdbd less on the login node)."""
        def ask() -> None:
            self._answer = slurm.usage(self.job_ids)

        self._asking = threading.Thread(target=ask, name="hpctrain-sacct", daemon=True)
        self._asking.start()

    def attempts(self, job_id: str) -> Optional[List[slurm_parse.Usage]]:
        """The job's attempts in accounting's order; None when accounting did not answer."""
        if not self.asked:
            self.asked = True
            if self._asking is not None:
                self._asking.join()
            answer = self._answer if self._asking is not None else slurm.usage(self.job_ids)
            if answer is None:
                self.problems.append("sacct did not answer: costs are estimated from the runs' records")
            else:
                rows, unreadable = answer
                if unreadable:
                    self.problems.append(f"sacct: {unreadable} line(s) could not be read (left out)")
                self._by_job = {}
                for row in rows:
                    self._by_job.setdefault(row.job_id, []).append(row)
        if self._by_job is None:
            return None
        found = self._by_job.get(job_id)
        if found is None and slurm_parse.split_job_id(job_id)[1] is None:
            found = self._by_job.get(f"{job_id}_0")  # a one-point sweep: a plain job, accounted by its own id
        return found or []

    def state(self, job_id: str) -> Optional[str]:
        """sacct's final state of the job (``-X``: its last attempt), asked once for the sweep."""
        if self._states is None:
            self._states = slurm.sacct(self.job_ids) or {}
        return self._states.get(job_id)


class _Judge:
    """Checks each run's record against the queue; asks slow sources (logs, sacct) only for runs it must."""

    def __init__(self, sweep: SweepListing, queue: Optional[slurm_parse.QueueState], accounting: Accounting) -> None:
        self.sweep = sweep
        self.warnings: List[str] = []
        self.queue = queue
        if sweep.launcher == "slurm" and queue is None:
            self.warnings.append("squeue did not answer: unfinished runs are shown as their records say")
        self.accounting = accounting
        self._launcher_alive: Optional[bool] = None
        self._workers_alive: Optional[bool] = None

    def sacct(self, job_id: str) -> Optional[str]:
        return self.accounting.state(job_id) if self.sweep.launcher == "slurm" else None

    def launcher_alive(self) -> bool:
        """A local sweep's launcher is still at work: a run's controller has it as parent, or, between two
        runs (or before the first), the sweep wrote something in the last minute."""
        if self._launcher_alive is None:
            live = [r.job_id for r in self.sweep.runs if r.job_id and jobs.pid_alive(r.job_id)]
            self._launcher_alive = bool(jobs.local_launcher(live, self.sweep.launcher_pid)) or jobs.recently_active(
                self.sweep.dir, [str(r.run_dir) for r in self.sweep.runs if r.run_dir], LAUNCHER_QUIET_S)
        return self._launcher_alive

    def workers_alive(self) -> bool:
        """A search with a worker still in the queue (or, local, alive): it adopts a trial whose worker died."""
        if self._workers_alive is None:
            ids = self.sweep.worker_job_ids
            if self.sweep.launcher == "slurm":
                self._workers_alive = self.queue is not None and any(slurm_parse.in_queue(self.queue, j) for j in ids)
            else:
                self._workers_alive = any(jobs.pid_alive(j) for j in ids)
        return self._workers_alive

    def state(self, spec: ListedRun, rs: RunState, summary: Dict[str, Any]) -> Tuple[State, str]:
        state, note = self._state(spec, rs, summary)
        if state is State.RETRYING:  # a hung run's retry that could not be kept off its node says so (exclusion.py)
            said = next((e.data().get("note") for e in reversed(rs.events) if e.kind is EventKind.RETRYING), None)
            if said:
                note = f"{said}; {note}" if note else str(said)
        return state, note

    def _state(self, spec: ListedRun, rs: RunState, summary: Dict[str, Any]) -> Tuple[State, str]:
        state = rs.state if rs.state is not None else State.parse(summary.get("status"))  # older runs: metrics.json
        if state in FAILURES:
            return self._failed(spec, state, rs.error or summary.get("error"))
        if state in FINAL or state in RESTING:
            return state, ""  # paused: no job holds it, whatever its last worker runs now
        job_id = spec.job_id
        pulled = self.sweep.search is None and bool(self.sweep.worker_job_ids)  # a grid's pull workers
        if pulled:  # the worker that started it (sweep.json names their array, which is no run's job)
            job_id = rs.job_id if state not in (None, State.QUEUED) else None
        if self.sweep.launcher == "slurm":
            if self.queue is None:
                return state or State.QUEUED, "queue unknown: as the run's record says"
            if job_id and slurm_parse.in_queue(self.queue, job_id):
                q_state, reason = self.queue.get(job_id) or self.queue.get(slurm_parse.split_job_id(job_id)[0], ("", ""))
                if q_state in slurm_parse.PENDING_STATES:
                    if held(q_state, reason):
                        return State.HELD, f"held by Slurm ({reason or q_state}): scontrol release {job_id}"
                    if state is State.RUNNING:  # started, pending again with no word from the run
                        return State.REQUEUED, f"requeued by Slurm (a node failure or scontrol requeue): {reason}"
                    return (state if state in (State.REQUEUED, State.RETRYING) else State.QUEUED), reason
                return (state if state is State.REQUEUED else State.RUNNING), ""
        elif job_id and jobs.pid_alive(job_id):
            return (state if state in (State.REQUEUED, State.RETRYING) else State.RUNNING), ""
        if (self.sweep.search is not None or pulled) and self.workers_alive():
            if pulled and state in (None, State.QUEUED, State.RETRYING):
                return state or State.QUEUED, "waiting for a worker to pull it"
            # its worker's job ended, not the trial: the study hands it to a live worker (an adoption)
            return State.QUEUED, "waiting for a worker to adopt it (its worker's job has ended)"
        return self._ended(spec, state)

    def _failed(self, spec: ListedRun, state: State, error: Optional[str]) -> Tuple[State, str]:
        """A failure caused by the time limit (submitit gave up requeuing, or Slurm killed it) is a timeout; a hang
        the watchdog ended stays hung (its one line is the error)."""
        if state is State.HUNG:
            return State.HUNG, ""
        if state is State.TIMEOUT or jobs.is_timeout(error or "") or (
                spec.job_id and jobs.log_marker(self.sweep.submitit_folder, spec.job_id) is State.TIMEOUT):
            return State.TIMEOUT, "hit its time limit"
        return State.FAILED, ""

    def _ended(self, spec: ListedRun, state: Optional[State]) -> Tuple[State, str]:
        """The record says active, but the job is gone from the queue (or never had one)."""
        folder, job_id = self.sweep.submitit_folder, spec.job_id
        started = state not in (None, State.QUEUED)
        waiting = state in (None, State.QUEUED, State.RETRYING)  # the local launcher starts it next
        if self.sweep.launcher == "local" and waiting and self.launcher_alive():
            return state or State.QUEUED, ""
        if job_id:
            marker = jobs.log_marker(folder, job_id)
            if marker:
                return marker, "from the job's log"
            acct = self.sacct(job_id)
            final = slurm_parse.SACCT_FINAL.get(acct) if acct else None
            if final is not None:
                if final is State.COMPLETED:
                    # the job script ended well (its step's exit code 0), but the run never recorded its
                    # completion: it ended without a result
                    return State.FAILED, f"sacct: {acct}, but the run never recorded its completion: see its log"
                return final, f"sacct: {acct}"
            outcome = jobs.result_outcome(folder, job_id)
            if outcome:
                return (State.COMPLETED if outcome == "success" else State.FAILED), "from submitit's result"
        if not started:
            if self.sweep.launcher == "local" and self.launcher_alive():
                return State.QUEUED, ""
            if self.sweep.launcher == "local" or not job_id:
                return State.CANCELLED, "never started; the sweep's launcher is gone"
            return State.CANCELLED, "left the queue without starting"
        return State.FAILED, "ended without a result (killed, out of memory or node failure?): see its log"


HELD_STATES = frozenset({"REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"})


def held(q_state: str, reason: str) -> bool:
    """Slurm holds the job: it waits for a release, not for resources (``launch failed requeued held``
    after a node failure, ``JobHeldAdmin``, ``JobHeldUser``)."""
    return q_state in HELD_STATES or "held" in reason.lower()


def collect(sweep: SweepListing, poller: "Optional[slurm.Poller[slurm_parse.QueueState]]" = None) -> Snapshot:
    """Every run's row, in run order, each built once. The queue is asked first (once for the whole sweep:
    files read after its answer are at least as new, so a run that ends meanwhile is never taken for lost);
    with a ``poller`` (``status --watch``), a failed call keeps the last answer for a few calls in a row.
    Accounting is asked once, for the runs the queue and files leave undecided and for the cost."""
    queue = None
    accounting = Accounting([r.job_id for r in sweep.runs if r.job_id])
    if sweep.launcher == "slurm":
        accounting.prefetch()
        queue = poller.poll() if poller is not None else slurm.squeue(
            [r.job_id for r in sweep.runs] + list(sweep.worker_job_ids))
    judge = _Judge(sweep, queue, accounting)
    if poller is not None and poller.unknown and queue is not None:
        judge.warnings.append(f"squeue failed {poller.failures} time(s) in a row: its last answer is shown")
    now = time.time()
    packed = packed_job_ids(sweep.runs)
    cache = row_cache.load(sweep.dir, row_cache.header_of(sweep.dir, sweep.submitit_folder, sweep.launcher,
                                                          sweep.search is not None))
    facts = [_facts(sweep, spec, judge, now, cache, packed) for spec in sweep.runs]
    declared = next((o for o in (_declared(sweep, f) for f in facts) if o), None) or {}
    metric = sweep.objective_metric or declared.get("metric") or fallback_metric(
        [f["metrics"] for f in facts if isinstance(f["metrics"], dict)])
    shares: Dict[str, int] = {}
    for spec in sweep.runs:
        if spec.job_id:
            shares[spec.job_id] = shares.get(spec.job_id, 0) + 1
    alloc = costs.allocation(sweep.dir)
    logs = _names(sweep.submitit_folder)  # one listing, not two stats a run
    rows = [_row(sweep, spec, f, metric, alloc, accounting, shares, packed, logs) for spec, f in zip(sweep.runs, facts)]
    cache.save()
    return Snapshot(sweep=sweep, runs=rows, warnings=judge.warnings + accounting.problems, taken=now,
                    dead_workers=dead_workers(sweep, judge), metric=metric)


def _facts(sweep: SweepListing, spec: ListedRun, judge: "_Judge", now: float, cache: row_cache.RowCache,
           packed: Set[str]) -> Dict[str, Any]:
    """What the run's own files say (:func:`_run_facts`): kept from an earlier read while those files are
    unchanged and its record final (:mod:`hpctrain.review.row_cache`), else read now (and kept when final)."""
    run_dir = str(spec.run_dir) if spec.run_dir else None
    key = None
    if run_dir is not None:
        key = row_cache.run_key(run_dir, spec.job_id, spec.job_id in packed)  # before the files are read
        kept = cache.get(run_dir, key, lambda f: _log_files(sweep, spec, f["job_id"], packed))
        if kept is not None:
            return kept
    found = (summary.read(spec.run_dir) if spec.run_dir else None) or {}
    rs = events.read(spec.run_dir)
    job_id = spec.job_id or rs.job_id
    if key is not None and rs.state in FAILURES:  # its state and error may come from its logs: their stats too
        key = row_cache.with_logs(key, _log_files(sweep, spec, job_id, packed))
    state, note = judge.state(spec, rs, found)
    out = _run_facts(sweep, spec, found, rs, job_id, state, note, now, packed)
    if run_dir is not None and key is not None and rs.state in FINAL:
        cache.keep(run_dir, key, out)
    return out


def _log_files(sweep: SweepListing, spec: ListedRun, job_id: Optional[str], packed: Set[str]) -> List[str]:
    """The logs a failed run's state and error are read from: its job's, its own when packed."""
    if not job_id:
        return []
    own = [str(RunPaths(spec.run_dir).packed_log)] if spec.job_id in packed and spec.run_dir else []
    return own + [jobs.log_path(sweep.submitit_folder, job_id, "err"), jobs.log_path(sweep.submitit_folder, job_id, "out")]


def fallback_metric(metrics: Iterable[Dict[str, Any]]) -> Optional[str]:
    """The objective of runs that declare none (any Hydra app), as ``status`` and ``report`` both rank by it:
    the validation loss if any run has one, else the training loss, else the first metric a run returned."""
    metrics = list(metrics)
    for name in ("val/loss", "train/loss"):
        if any(name in m for m in metrics):
            return name
    return next((k for m in metrics for k in m), None)


def dead_workers(sweep: SweepListing, judge: _Judge) -> List[str]:
    """A search whose workers have all ended while the study has no trial past its start (every worker
    crashed at start, say): one line per worker with its error (its record, else its job's log)."""
    if sweep.search is None or not sweep.worker_job_ids or judge.workers_alive():
        return []
    if sweep.launcher == "slurm" and judge.queue is None:
        return []  # the queue is unknown: the workers may be alive
    if any(r.run_dir and events.read(r.run_dir).state in FINAL for r in sweep.runs):
        return []  # trials ended: the workers did their work (a search that finished)
    lines = []
    for i, job_id in enumerate(sweep.worker_job_ids):
        placeholder = SweepPaths(sweep.dir).worker_placeholder(i)
        error = events.read(placeholder).error if placeholder.is_dir() else None
        if not error:
            tail = jobs.tail_lines(jobs.log_path(sweep.submitit_folder, job_id, "err"), 10)
            error = next((line for line in reversed(tail) if "Error" in line or "error" in line), None) or (
                tail[-1] if tail else None)
        last = (error or "").strip().splitlines()[-1:] or ["no error in its record or log"]
        lines.append(f"worker {job_id} died: {last[0]}")
    return lines


def _declared(sweep: SweepListing, found: Dict[str, Any]) -> Optional[Dict[str, str]]:
    """The objective a run declares: a search trial the study's, else its metrics.json's."""
    if sweep.search is not None:
        return {"metric": str(sweep.objective_metric), "mode": search_review.direction(sweep.search).value}
    objective = found.get("objective")
    return objective if isinstance(objective, dict) and objective.get("metric") else None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def packed_job_ids(specs: Iterable[Any]) -> Set[str]:
    """Job ids that several runs share: their task runs them side by side (``runs_per_task``)."""
    seen: Set[str] = set()
    shared: Set[str] = set()
    for spec in specs:
        if spec.job_id:
            (shared if spec.job_id in seen else seen).add(spec.job_id)
    return shared


def _run_facts(sweep: SweepListing, spec: ListedRun, summary: Dict[str, Any], rs: RunState, job_id: Optional[str],
               state: State, note: str, now: float, packed: Set[str]) -> Dict[str, Any]:
    """What a row takes from the run's own files (record, metrics.json, a failure's logs), as plain JSON
    values (a final run's are kept as they are: :mod:`hpctrain.review.row_cache`)."""
    values = summary.get("metrics") or {}
    loss = values.get("train/loss")
    walls = costs.attempt_walls(rs, now, state is State.RUNNING, summary.get("updated"))
    if sweep.search is not None:  # a search trial: ranked by the study's objective, as its worker told it
        told = search_review.objective(summary, sweep.objective_metric)
        if told is not None and sweep.objective_metric not in values:
            values = {**values, str(sweep.objective_metric): told}
    stage = None
    for key in ("rung", "interval"):
        if isinstance(summary.get(key), int):
            stage = f"{key} {summary[key]}"
    sampled = summary.get("sys")
    utilisation = {k: float(v) for k, v in sampled.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(sampled, dict) else {}
    error = None
    if state in FAILURES:
        own_log = str(RunPaths(spec.run_dir).packed_log) if spec.job_id in packed and spec.run_dir else None
        error = rs.error or summary.get("error") or (
            "\n".join(jobs.tail_lines(own_log or jobs.log_path(sweep.submitit_folder, job_id, "err"), 10)) or None
            if job_id else None)
    return {
        "job_id": job_id, "state": state.value, "note": note, "step": summary.get("step"),
        "max_steps": summary.get("max_steps"), "loss": float(loss) if isinstance(loss, (int, float)) else None,
        "elapsed_s": _elapsed(summary, rs, state, now, walls),
        "restarts": rs.restarts if rs.state is not None else int(summary.get("restarts") or 0),
        "error": error, "metrics": dict(values), "objective": summary.get("objective"), "walls": walls,
        "utilisation": utilisation, "stage": stage,
        "requeue_steps": [_requeue_steps(e.data()) for e in rs.events if e.kind is EventKind.REQUEUED],
        "hardware": dict(summary["hardware"]) if isinstance(summary.get("hardware"), dict) else {},
        "stragglers": summary.get("stragglers")}


_STATES = {s.value: s for s in State}


def _row(sweep: SweepListing, spec: ListedRun, f: Dict[str, Any], metric: Optional[str], alloc: costs.Allocation,
         accounting: Accounting, shares: Dict[str, int], packed: Set[str], logs: Optional[Set[str]]) -> Run:
    """One run's row from its files' facts (:func:`_run_facts`) and what the sweep says now: its place and
    values in the manifest, its log, its cost. ``logs``: the names in the submitit folder, listed once for
    the sweep (None: stat each log)."""
    state, job_id, walls, values = _STATES[f["state"]], f["job_id"], f["walls"], f["metrics"]
    requeue_steps = [(s, c) for s, c in f["requeue_steps"]]
    return Run(
        idx=spec.idx, name=spec.name, values=sweep.values(spec), overrides=spec.overrides, run_dir=spec.run_dir,
        job_id=job_id, state=state, note=f["note"], step=f["step"], max_steps=f["max_steps"] or spec.max_steps,
        loss=f["loss"], elapsed_s=f["elapsed_s"], restarts=f["restarts"],
        log=_log(sweep, spec, job_id, state, spec.job_id in packed, logs), error=f["error"], metrics=values,
        declared_objective=_declared(sweep, f), objective=_number(values.get(metric)) if metric else None,
        wall_s=sum(walls), attempts=len(walls), utilisation=f["utilisation"], stage=f["stage"],
        requeue_steps=requeue_steps, hardware=f["hardware"], stragglers=slow.entries(f.get("stragglers")),
        cost=_cost(sweep, job_id, walls, alloc, accounting, shares, requeue_steps, f["step"]))


def _cost(sweep: SweepListing, job_id: Optional[str], walls: List[float], alloc: costs.Allocation,
          accounting: Accounting, shares: Dict[str, int], requeue_steps: List[Tuple[Optional[int], Optional[int]]],
          step: Optional[int]) -> Optional[Cost]:
    """From accounting where it answers for the job, else estimated from the record (marked so)."""
    shared = shares.get(job_id, 1) if job_id else 1
    attempts = accounting.attempts(job_id) if job_id and sweep.launcher == "slurm" else None
    cost = (costs.from_accounting(attempts, shared) if attempts
            else costs.from_record(sum(walls), len(walls), alloc, shared))
    return costs.with_redone(cost, requeue_steps, step) if cost is not None and requeue_steps else cost


def _log(sweep: SweepListing, spec: ListedRun, job_id: Optional[str], state: State, packed: bool,
         logs: Optional[Set[str]]) -> Optional[str]:
    """The log to read: a packed run's own output; else its job's stderr when it failed, else its stdout."""
    own_log = str(RunPaths(spec.run_dir).packed_log) if packed and spec.run_dir else None
    if own_log and _size(own_log) >= 0:  # the task's log holds all of its runs
        return own_log
    if not job_id:
        return None
    err, out = jobs.log_name(job_id, "err"), jobs.log_name(job_id, "out")  # joined only for the one returned
    folder = f"{sweep.submitit_folder}{os.sep}"  # jobs.log_path's join, as plain strings: 10,000 runs

    def present(name: str) -> bool:
        return name in logs if logs is not None else _size(folder + name) >= 0

    if (state in FAILURES or state is State.CANCELLED) and present(err) and _size(folder + err) > 0:
        return folder + err
    if present(out):
        return folder + out
    return folder + err if present(err) else None


def _elapsed(summary: Dict[str, Any], rs: RunState, state: State, now: float, walls: List[float]) -> Optional[float]:
    """The run's time over all its attempts: this attempt's as the trainer counts it (metrics.json
    ``started``/``elapsed_s``, rewritten each attempt), plus the earlier attempts' by the record (``walls``)."""
    started = summary.get("started")
    last_start = rs.last_start.time_ns / 1e9 if rs.last_start is not None else None
    earlier = sum(walls[:-1])
    if not isinstance(started, (int, float)):
        started = last_start if state is State.RUNNING else None
    if state is not State.RUNNING and isinstance(summary.get("elapsed_s"), (int, float)):
        return float(summary["elapsed_s"]) + earlier
    if started is None:
        started, earlier = rs.started_at, 0.0  # from the record's first start: every attempt is in it
    if started is None:
        return summary.get("elapsed_s")
    if state is State.RUNNING:
        return max(0.0, now - started) + earlier
    ended = rs.ended_at or summary.get("updated")
    return max(0.0, ended - started) + earlier if isinstance(ended, (int, float)) else None


def _requeue_steps(data: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    def step(value: Any) -> Optional[int]:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return step(data.get("step")), step(data.get("checkpoint_step"))


def _names(folder: Path) -> Optional[Set[str]]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
