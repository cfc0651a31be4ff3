"""After an attempt's tasks all ended: the one place that records a silent death and decides a retry.

The Slurm job script runs this right after ``srun`` (``python -m hpctrain.job.attempt_ended
RUNS INDEX RC MAX_RETRIES [LOG]``; INDEX counts from the start of the submission across its arrays, and a
packed task's entry in RUNS lists its runs); the local launcher calls :func:`attempt_ended` when a job's process
ends. A run whose record still says running when its tasks are gone died without a word (killed, out
of memory, node failure): it is recorded failed. A failed attempt, whichever rank crashed, is retried
while the budget lasts: ``retrying`` in the record, then the job is requeued (Slurm) or submitted
again (local launcher). An attempt ends only its own: in a Slurm job, a run whose record is at another
job's attempt (an orphan array of an interrupted submission, whose runs were submitted again) is left alone
(:func:`owns_attempt`). A search's or a pulled grid's worker task (its placeholder run dir) is recorded, never
retried: a requeued task keeps its id and would take its trial back as its own, an adoption nobody counts;
what a dead worker held is adopted by another, within ``max_retries + 1`` deaths. The requeue is asked of the batch script's host-side helper
(:mod:`hpctrain.slurm.host`): this step may run inside the job's container, which has no Slurm client. No torch here.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Callable, List, Optional

from hpctrain.core import events, manifest, summary
from hpctrain.core.state import REQUEUE_FAILED, EventKind, RunState, State
from hpctrain.core.errors import DiskFullError, deterministic, last_line
from hpctrain.core.paths import SweepPaths
from hpctrain.core.run import RunSpec
from hpctrain.slurm import exclusion, host
from hpctrain.slurm.exclusion import Exclusion
from hpctrain.slurm.parse import job_order


def job_of_key(key: Optional[str]) -> Optional[str]:
    """The Slurm job (``123_4``) of a record key (``123_4r1``): the restart count dropped."""
    return key.rsplit("r", 1)[0] if key else None


def owns_attempt(rs: RunState, key: Optional[str], recorded_job: Callable[[], Optional[str]]) -> bool:
    """Whether the attempt the record is at belongs to the Slurm job of ``key`` (this teardown's).

    Running: its ``started`` names the job; retrying: the teardown that wrote ``retrying`` (the same job,
    requeued); queued (submitted, not started): the job sweep.json gives the run (``recorded_job``).
    An event without a key (written outside Slurm), or no key of ours: the attempt counts as ours."""
    mine = job_of_key(key)
    if mine is None:
        return True
    if rs.state is State.RUNNING and rs.last_start is not None:
        theirs = job_of_key(rs.last_start.key)
    elif rs.state is State.RETRYING:
        retry = [e for e in rs.events if e.kind is EventKind.RETRYING]
        theirs = job_of_key(retry[-1].key) if retry else None
    elif rs.state is State.QUEUED:
        theirs = recorded_job()
    else:
        return True
    return theirs is None or theirs == mine


def attempt_ended(run_dir: Path, exit_code: Optional[int], max_retries: int, log_path: str = "",
                  recorded_job: Callable[[], Optional[str]] = lambda: None,
                  avoid: Optional[Exclusion] = None) -> Optional[int]:
    """Record a silent death, decide a retry; the retry number when the run is to be retried, else None.
    A run at another job's attempt is left alone (None). ``avoid``: the nodes the job's requeue keeps off (a hung
    run's retry, :mod:`hpctrain.slurm.exclusion`), said in its ``retrying``."""
    rs = events.read(run_dir)
    key = events.slurm_key()
    if rs.state is not None and not owns_attempt(rs, key, recorded_job):
        print(f"hpctrain: {run_dir.name}: its record is at another job's attempt, not this job's ({job_of_key(key)}): "
              f"left alone", file=sys.stderr, flush=True)
        return None
    # RETRYING too: a retry attempt whose tasks died before the run started (a packed task's parent
    # crashed, a broken environment) would otherwise stay "retrying" with nothing left to run it
    if rs.state in (State.RUNNING, State.QUEUED, State.RETRYING) and exit_code != 0:
        where = f"; see {log_path}" if log_path else ""
        events.failed(run_dir, f"the job's tasks ended with exit code {exit_code} while the run was still running "
                               f"(killed, out of memory, or a node failure){where}", fallout=False)
    attempt = events.retry_allowed(run_dir, max_retries)
    after = events.read(run_dir)
    if attempt is None and after.state is State.FAILED and max_retries > 0 and deterministic(after.error):
        print(f"hpctrain: {run_dir.name} failed with {last_line(after.error)}: the same error would come back on "
              f"every attempt, not retried", file=sys.stderr, flush=True)
    hung = avoid_nodes(rs) if attempt is not None and rs.state is State.HUNG and key else []
    nodes = [n for n in hung if avoid is None or n in avoid.avoided]
    kept = [n for n in hung if avoid is not None and n in avoid.kept]
    if attempt is not None:
        said = {"not_avoided": kept, "note": avoid.note} if kept and avoid is not None else {}
        events.retrying(run_dir, attempt, max_retries, **({"avoid_nodes": nodes} if nodes else {}), **said)
        away = (f", away from node(s) {','.join(nodes)}" if nodes else "") + (f"; {said['note']}" if said else "")
        print(f"hpctrain: {run_dir.name} {rs.state if rs.state is State.HUNG else 'failed'}; retry {attempt} of "
              f"{max_retries}{away}", file=sys.stderr, flush=True)
    if rs.state is not None:
        summary.write(run_dir)
    return attempt


def worker_job(found: manifest.Manifest, index: int) -> Optional[str]:
    """The job of worker ``index`` of the newest submission that has one (sweep.json's ``worker_job_ids``)."""
    for sub in reversed(found.submissions):
        ids = sorted((str(j) for j in sub.extra.get("worker_job_ids") or []), key=job_order)
        if 0 <= index < len(ids):
            return ids[index]
    return None


def avoid_nodes(rs: RunState) -> List[str]:
    """The nodes a hung run's retry keeps off: where a rank waited in its own code (the watchdog's record),
    else every node that saw the hang."""
    hung = [e.data() for e in rs.events if e.kind is EventKind.HUNG]
    own = [n for d in hung if not d.get("fallout") for n in d.get("nodes") or []]
    return sorted(set(own or [n for d in hung for n in d.get("nodes") or []]))


def task_runs(runs_file: Path, index: int) -> "tuple[Optional[Path], List[tuple[Optional[int], Path]]]":
    """The sweep dir and the runs (index, run dir) of task ``index`` of a submission's run list
    (``Submission.runs_json``: the sweep dir and, per task, its runs' :meth:`RunSpec.to_json`); no runs for
    an index past its end."""
    data = json.loads(runs_file.read_text())
    if isinstance(data, list):  # a submission made before run lists held RunSpecs: run dirs, a list per pack
        task = data[index] if 0 <= index < len(data) else []
        return None, [(None, Path(d)) for d in (task if isinstance(task, list) else [task])]
    tasks, sweep_dir = data["tasks"], Path(data["sweep_dir"])
    if not 0 <= index < len(tasks):
        return sweep_dir, []
    specs = [RunSpec.from_json(spec, sweep_dir) for spec in tasks[index]]
    return sweep_dir, [(spec.idx, spec.run_dir) for spec in specs]


def task_run_dirs(runs_file: Path, index: int) -> List[Path]:
    """The run dirs of task ``index`` of a submission's run list (see :func:`task_runs`)."""
    return [run_dir for _, run_dir in task_runs(runs_file, index)[1]]


def ended_or_said(run_dir: Path, exit_code: Optional[int], max_retries: int, log_path: str = "",
                  recorded_job: Callable[[], Optional[str]] = lambda: None,
                  avoid: Optional[Exclusion] = None) -> Optional[int]:
    """:func:`attempt_ended`; on a full disk, the record unwritable, one line on stderr and no retry."""
    try:
        return attempt_ended(run_dir, exit_code, max_retries, log_path, recorded_job, avoid)
    except DiskFullError as full:
        try:
            print(f"hpctrain: {run_dir.name} (exit code {exit_code}) cannot be recorded: {full}", file=sys.stderr,
                  flush=True)
        except OSError:
            pass
        return None


def main(argv: list) -> int:
    runs_file, index, exit_code, max_retries = argv[0], int(argv[1] or 0), int(argv[2]), int(argv[3])
    sweep_dir, runs = task_runs(Path(runs_file), index)
    run_dirs = [run_dir for _, run_dir in runs]
    log = argv[4] if len(argv) > 4 else ""
    read: List[Optional[manifest.Manifest]] = []  # sweep.json, read only if a queued run's job is asked

    workers = os.path.abspath(SweepPaths(sweep_dir).workers) if sweep_dir is not None else None

    def is_worker(run_dir: Path) -> bool:
        return os.path.abspath(run_dir.parent) == workers

    def recorded_job(idx: Optional[int], run_dir: Path) -> Callable[[], Optional[str]]:
        def job() -> Optional[str]:
            if idx is None:
                return None
            if not read:
                read.append(manifest.read(sweep_dir) if sweep_dir is not None else None)
            if read[0] is not None and is_worker(run_dir):  # sweep.json's runs are its trials or points
                return worker_job(read[0], idx)
            entry = read[0].runs.get(idx) if read[0] is not None else None
            return entry.job_id if entry is not None else None
        return job

    before = [events.read(run_dir) for run_dir in run_dirs]
    # a hung run's retry avoids its nodes where the partition can spare them: decided before the retrying events
    hung = sorted({n for rs in before if rs.state is State.HUNG for n in avoid_nodes(rs)})
    avoid = exclusion.decide(hung) if hung and max_retries > 0 and events.slurm_key() else None
    # every run decides, none skipped
    retries = [ended_or_said(run_dir, exit_code, 0 if is_worker(run_dir) else max_retries, log,
                             recorded_job(idx, run_dir), avoid) for idx, run_dir in runs]
    if exit_code != 0 and any(is_worker(run_dir) for run_dir in run_dirs):
        print(f"hpctrain: a worker's task ended with exit code {exit_code}: not requeued; what it held is adopted "
              f"by another worker (or by the same command again)", file=sys.stderr, flush=True)
    if not any(r is not None and rs.state is State.HUNG for rs, r in zip(before, retries)):
        avoid = None  # no hung run is retried: a plain requeue
    if any(r is not None for r in retries):
        job_id = os.environ.get("SLURM_ARRAY_JOB_ID")
        job_id = f"{job_id}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job_id else os.environ.get("SLURM_JOB_ID", "")
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue SIGTERMs the job, this step too
        try:
            ans = host.requeue_avoiding(avoid.exclude) if avoid is not None and avoid.avoided else host.requeue()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if avoid is not None and ans.stdout is not None:
            kept = host.EXCLUDE_FAILED not in ans.stdout
            print(f"hpctrain: requeued {job_id}" + (
                f" with node(s) {','.join(avoid.avoided)} excluded" if avoid.avoided and kept else
                f"; its excluded nodes could not be set ({' '.join(ans.stdout.split())})" if avoid.avoided else "")
                + (f"; {avoid.note}" if avoid.note else ""), file=sys.stderr)
        if ans.stdout is None:  # the retry cannot happen: the runs end failed, saying why
            for run_dir, retry in zip(run_dirs, retries):
                if retry is not None:
                    events.failed(run_dir, f"retry not possible: {REQUEUE_FAILED} (scontrol requeue {job_id}): "
                                           f"{ans.error}")
                    summary.write(run_dir)
            print(f"hpctrain: {REQUEUE_FAILED} (scontrol requeue {job_id}): {ans.error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
