"""One record per run of a sweep, with its state decided from what is really there.

Sources, asked in this order: the queue (``squeue``, once for the whole sweep; for local sweeps the
job's controller process), then the run's own files (metrics.json, events), the cancel record that
``hpctrain cancel`` leaves, the job's submitit logs and result pickle, and ``sacct`` where accounting
exists. The queue is asked before the files are read, so a job that ends in between is seen ended.
"""

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from hpctrain import runfiles
from hpctrain.review import jobs, queue
from hpctrain.search import review as search_review
from hpctrain.review.sweepdir import RunSpec, Sweep

STATES = ("pending", "running", "requeued", "completed", "pruned", "failed", "timeout", "cancelled")
ACTIVE = ("pending", "running", "requeued")
FAILURES = ("failed", "timeout")
LAUNCHER_QUIET_S = 60.0  # a local sweep that wrote nothing for this long, with no run alive, has no launcher

# sacct's final states -> ours
_SACCT = {"COMPLETED": "completed", "FAILED": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
          "BOOT_FAIL": "failed", "DEADLINE": "timeout", "TIMEOUT": "timeout", "CANCELLED": "cancelled",
          "PREEMPTED": "cancelled", "REVOKED": "cancelled"}


@dataclass
class RunRecord:
    idx: int
    name: str
    values: Dict[str, str]  # swept values
    overrides: List[str]
    run_dir: Optional[str]
    job_id: Optional[str]
    state: str
    note: str = ""  # why that state, when it was inferred
    step: Optional[int] = None
    max_steps: Optional[int] = None
    loss: Optional[float] = None  # the last train/loss
    elapsed_s: Optional[float] = None
    restarts: int = 0
    log: Optional[str] = None
    error: Optional[str] = None  # the traceback tail of a failed run
    metrics: Dict[str, Any] = field(default_factory=dict)
    objective: Optional[float] = None  # a search trial's objective (hpctrain.search.review.objective)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Snapshot:
    sweep: Sweep
    runs: List[RunRecord]
    warnings: List[str]
    taken: float

    def counts(self) -> Dict[str, int]:
        out = {s: 0 for s in STATES}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return {s: n for s, n in out.items() if n}

    def active(self) -> List[RunRecord]:
        return [r for r in self.runs if r.state in ACTIVE]


class _Judge:
    """Decides each run's state; asks slow sources (logs, sacct) only for runs the fast ones leave open."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.warnings: List[str] = []
        self.queue: Optional[Dict[str, Tuple[str, str]]] = None
        if sweep.launcher == "slurm":
            self.queue = queue.squeue_query([r.job_id for r in sweep.runs if r.job_id])
            if self.queue is None:
                self.warnings.append("squeue did not answer: states of unfinished runs come from their files only")
        self.cancelled = jobs.read_cancelled(sweep.dir)
        self._sacct: Optional[Dict[str, str]] = None
        self._launcher_alive: Optional[bool] = None

    def sacct(self, job_id: str) -> Optional[str]:
        if self._sacct is None:
            raw = queue.sacct_states([r.job_id for r in self.sweep.runs if r.job_id])
            self._sacct = {j: s for key, s in raw.items() for j in queue.expand_array_ids(key)}
        return self._sacct.get(job_id)

    def launcher_alive(self) -> bool:
        """A local sweep's launcher is still at work: a run's controller has it as parent, or, between two
        runs (or before the first), the sweep wrote something in the last minute."""
        if self._launcher_alive is None:
            live = [r.job_id for r in self.sweep.runs if r.job_id and jobs.pid_alive(r.job_id)]
            self._launcher_alive = bool(jobs.local_launcher(live, self.sweep.launcher_pid)) or jobs.recently_active(
                self.sweep.dir, [str(r.run_dir) for r in self.sweep.runs if r.run_dir], LAUNCHER_QUIET_S)
        return self._launcher_alive

    def state(self, spec: RunSpec, metrics: Dict[str, Any], att: "Attempts") -> Tuple[str, str]:
        status = metrics.get("status")
        if status in (runfiles.COMPLETED, "pruned"):  # final; pruned: a search trial stopped early
            return status, ""
        if self.sweep.search and status == runfiles.FAILED:
            return "failed", ""  # a search trial: its worker (still in the queue) has moved on to the next trial
        job_id = spec.job_id
        if job_id and att.any_events and att.starts == 0:
            status = None  # the current job never started: metrics.json is from an earlier submission
        if (job_id or f"run:{spec.idx}") in self.cancelled:  # a local run that never started has no job id
            return "cancelled", "cancelled with hpctrain cancel"
        if att.final_failure:
            return self._failed(spec, metrics, att)  # out of retries: the job may still be finishing in the queue
        waiting_again = status in (runfiles.REQUEUED, runfiles.RETRYING)
        if job_id and self.queue is not None and job_id in self.queue:
            q_state, reason = self.queue[job_id]
            if q_state in queue.PENDING_STATES:
                return ("requeued" if att.starts or waiting_again else "pending"), reason
            return ("requeued" if waiting_again else "running"), ""
        if job_id and self.sweep.launcher == "local" and jobs.pid_alive(job_id):
            return ("requeued" if waiting_again else "running"), ""
        return self._ended(spec, status, metrics, att)

    def _failed(self, spec: RunSpec, metrics: Dict[str, Any], att: "Attempts") -> Tuple[str, str]:
        """A failure caused by the time limit (submitit gave up requeuing, or Slurm killed it) is a timeout."""
        error = f"{metrics.get('error') or ''}\n{att.last_error or ''}"
        if jobs.is_timeout(error) or (spec.job_id and jobs.log_marker(self.sweep.submitit_folder, spec.job_id) == "timeout"):
            return "timeout", "hit its time limit"
        return "failed", ""

    def _ended(self, spec: RunSpec, status: Optional[str], metrics: Dict[str, Any], att: "Attempts"
               ) -> Tuple[str, str]:
        """Not in the queue (or the queue is unknown): the run ended, never started, or is not yet known."""
        folder, job_id = self.sweep.submitit_folder, spec.job_id
        if status == runfiles.FAILED:
            return self._failed(spec, metrics, att)
        if job_id:
            marker = jobs.log_marker(folder, job_id)
            if marker:
                return marker, "from the job's log"
            acct = self.sacct(job_id)
            if acct in _SACCT:
                return _SACCT[acct], f"sacct: {acct}"
            outcome = jobs.result_outcome(folder, job_id)
            if outcome:
                return ("completed" if outcome == "success" else "failed"), "from submitit's result"
        started = bool(status) or att.starts > 0
        if self.sweep.launcher == "slurm" and self.queue is None:
            return ("running" if started else "pending"), "queue unknown: from the run's files"
        if not started:
            if self.sweep.launcher == "local" and self.launcher_alive():
                return "pending", ""
            if self.sweep.launcher == "local" or not job_id:
                return "cancelled", "never started; the sweep's launcher is gone"
            return "cancelled", "left the queue without starting"
        return "failed", "ended without a result (killed, out of memory or node failure?): see its log"


@dataclass
class Attempts:
    """What the run's events say about its current job (rerunning a sweep submits a new job per run)."""

    starts: int  # attempts of the current job that started: restarts = starts - 1
    final_failure: bool  # the last attempt failed and no retry follows
    any_events: bool
    last_error: Optional[str] = None  # of the current job's last failure


def attempts(events: List[Dict], job_id: Optional[str]) -> Attempts:
    def mine(e: Dict) -> bool:
        return job_id is None or str(e.get("job_id")) == job_id

    starts = sum(e.get("event") == "start" and mine(e) for e in events)
    last = [e for e in events if e.get("event") != "submitted"]  # the launcher's note, written after submitting
    final = bool(last) and last[-1].get("event") == "failed" and mine(last[-1])
    errors = [e.get("error") for e in events if e.get("event") == "failed" and mine(e) and e.get("error")]
    return Attempts(starts=starts, final_failure=final, any_events=bool(events),
                    last_error=str(errors[-1]) if errors else None)


def collect(sweep: Sweep) -> Snapshot:
    """Every run's record, in run order."""
    judge = _Judge(sweep)  # asks the queue first
    now = time.time()
    records = []
    sweep_dir = str(sweep.dir)
    for spec in sweep.runs:
        metrics = runfiles.read_json(os.path.join(spec.run_dir, runfiles.METRICS)) if spec.run_dir else None
        metrics = metrics or {}
        events = runfiles.read_events(sweep_dir, spec.idx)
        att = attempts(events, spec.job_id)
        state, note = judge.state(spec, metrics, att)
        records.append(_record(sweep, spec, metrics, events, att, state, note, now))
    return Snapshot(sweep=sweep, runs=records, warnings=judge.warnings, taken=now)


def _record(sweep: Sweep, spec: RunSpec, metrics: Dict[str, Any], events: List[Dict], att: Attempts, state: str,
            note: str, now: float) -> RunRecord:
    values = metrics.get("metrics") or {}
    loss = values.get("train/loss")
    rec = RunRecord(
        idx=spec.idx, name=spec.name, values=sweep.values(spec), overrides=spec.overrides,
        run_dir=str(spec.run_dir) if spec.run_dir else None, job_id=spec.job_id, state=state, note=note,
        step=metrics.get("step"), max_steps=metrics.get("max_steps") or spec.max_steps,
        loss=float(loss) if isinstance(loss, (int, float)) else None,
        elapsed_s=_elapsed(metrics, state, now),
        restarts=max(0, att.starts - 1),
        metrics=dict(values),
        objective=search_review.objective(metrics, sweep.objective_metric),
    )
    if spec.job_id:
        err = jobs.log_path(sweep.submitit_folder, spec.job_id, "err")
        out = jobs.log_path(sweep.submitit_folder, spec.job_id, "out")
        err_size = _size(err)
        if state in FAILURES + ("cancelled",) and err_size > 0:
            rec.log = err
        elif _size(out) >= 0:
            rec.log = out
        elif err_size >= 0:
            rec.log = err
    if state in FAILURES:
        rec.error = _error(sweep, spec, metrics, events)
    return rec


def _elapsed(metrics: Dict[str, Any], state: str, now: float) -> Optional[float]:
    started = metrics.get("started")
    if not isinstance(started, (int, float)):
        return metrics.get("elapsed_s")
    if state == "running":
        return max(0.0, now - started)
    if isinstance(metrics.get("elapsed_s"), (int, float)):
        return float(metrics["elapsed_s"])
    updated = metrics.get("updated")
    return max(0.0, updated - started) if isinstance(updated, (int, float)) else None


def _error(sweep: Sweep, spec: RunSpec, metrics: Dict[str, Any], events: List[Dict]) -> Optional[str]:
    """The traceback tail: metrics.json's, else the last failure event's, else the end of the job's stderr."""
    if metrics.get("error"):
        return str(metrics["error"])
    failed = [e for e in events if e.get("event") == "failed" and e.get("error")]
    if failed:
        return str(failed[-1]["error"])
    if spec.job_id:
        lines = jobs.tail_lines(jobs.log_path(sweep.submitit_folder, spec.job_id, "err"), 10)
        return "\n".join(lines) or None
    return None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
