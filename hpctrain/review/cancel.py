"""``hpctrain cancel``: cancel what is still queued or running, whole arrays or single tasks.

Slurm: ``scancel`` (the array id when the whole sweep is cancelled, ``<array>_<task>`` ids for chosen
runs), then the queue is asked until the jobs have left it. Local: the sweep's launcher is stopped
first (so it starts nothing new; it cancels its runs itself, as on Ctrl-C), then each run still going is
asked to checkpoint (submitit's preemption signal) and stopped (:func:`hpctrain.core.stopping.end_runs`). Each cancelled run gets ``cancelled`` in its run record: without accounting, nothing else
would tell ``status`` that a job that left the queue was cancelled. A packed run (``runs_per_task``) chosen
with ``--run`` is stopped by its own task, which sees ``cancelled`` in its record; the task and its other
runs go on.
"""

import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from rich.markup import escape

from hpctrain._compat.submitit import preemption_signal
from hpctrain.core import events, launcher_id, manifest, stopping, summary
from hpctrain.core.paths import PACKED_CANCELLED, RunPaths
from hpctrain.core.state import ACTIVE, State
from hpctrain.review import fmt, jobs
from hpctrain.review.runs import Run, Snapshot, collect, packed_job_ids
from hpctrain.review.status import counts_line
from hpctrain.review.sweep import load_sweep
from hpctrain.slurm import parse as slurm_parse
from hpctrain.slurm import query as slurm

WAIT_S = 20.0


def _slurm(snap: Snapshot, targets: List[Run], whole: bool) -> Dict[str, int]:
    """scancel, then wait until the jobs have left the queue; ``{job_id: idx}`` of those cancelled."""
    if whole:  # one id per array cancels every task of it still queued or running
        ids = sorted(set(slurm_parse.array_ids(r.job_id for r in targets)) | set(_queued_arrays(snap.sweep.dir)),
                     key=slurm_parse.job_order)
    else:
        ids = [r.job_id for r in targets if r.job_id]
    rc, err = slurm.scancel(ids)
    if rc != 0 and err:
        print(f"hpctrain cancel: scancel {' '.join(ids)}: {err}", file=sys.stderr)
    left = {r.job_id: r.idx for r in targets if r.job_id}
    deadline = time.time() + WAIT_S
    while True:
        queued = slurm.squeue(list(left))
        if queued is None:  # the queue cannot be asked: trust scancel's word
            still = set() if rc == 0 else set(left)
            break
        still = {j for j in left if j in queued and queued[j][0] not in ("COMPLETING", "CANCELLED")}
        if not still or time.time() > deadline:
            break
        time.sleep(0.5)
    for job_id in sorted(still, key=slurm_parse.job_order):
        print(f"hpctrain cancel: run #{left[job_id]} (job {job_id}) is still in the queue", file=sys.stderr)
    return {j: i for j, i in left.items() if j not in still}


def _queued_arrays(sweep_dir: Path) -> List[str]:
    """The arrays any submission of the sweep queued (sweep.json) that still have tasks in the queue: a run
    maps to its latest job only, and an earlier array must not be left behind."""
    m = manifest.read(sweep_dir)
    ids = slurm_parse.array_ids(j for s in (m.submissions if m else []) for j in s.job_ids)
    queue = slurm.squeue(ids) if ids else {}
    return sorted({slurm_parse.split_job_id(j)[0] for j in queue or {}} & set(ids), key=slurm_parse.job_order)


def _local(snap: Snapshot, targets: List[Run], whole: bool) -> Dict[str, int]:
    """The launcher first (it would start the next pending run), then each running run's processes.

    The launcher is found as the parent of a run's controller; the sweep is looked at again until no
    run of it is alive (a run may start while the others are being stopped).
    """
    chosen = {r.idx for r in targets}
    done: Dict[str, int] = {}
    for attempt in range(5):
        live = [(spec.idx, spec.job_id) for spec in load_sweep(snap.sweep.dir).runs
                if spec.job_id and spec.job_id not in done and jobs.pid_alive(spec.job_id)
                and (whole or spec.idx in chosen)]
        if whole:
            recorded = launcher_id.verified(snap.sweep.dir, snap.sweep.launcher_pid)  # a reused pid is not it
            launcher = jobs.local_launcher([job_id for _, job_id in live], recorded)
            if attempt == 0 and not live and any(r.state is State.QUEUED for r in targets):
                print("hpctrain cancel: warning: no run of this local sweep is running, so its launcher cannot be "
                      "found; if it is still starting, stop it with Ctrl-C where it runs", file=sys.stderr)
            # a local launcher cancels its own runs on the signal (checkpoints first): the time that takes
            wait_s = stopping.CHECKPOINT_GRACE_S + 2 * stopping.GRACE_S
            if launcher and not stopping.stop_process(launcher, "python", wait_s):
                print(f"hpctrain cancel: the sweep's launcher (pid {launcher}) did not stop", file=sys.stderr)
        left = set(stopping.end_runs([job_id for _, job_id in live], preemption_signal()))
        for idx, job_id in live:
            if job_id not in left:
                done[job_id] = idx
            else:
                print(f"hpctrain cancel: run #{idx} (pid {job_id}) did not stop", file=sys.stderr)
        if not whole or not live:
            break
        time.sleep(1.0)
    if whole:
        done.update({f"run:{r.idx}": r.idx for r in targets if not r.job_id})  # never started: never will
    return done


def _left_to_their_pack(snap: Snapshot, targets: List[Run]) -> List[Run]:
    """Chosen runs whose task runs other active runs too (``runs_per_task``): cancelling the task would end
    those as well, so the task itself stops these (it reads each running run's record, see pack.py)."""
    packed = packed_job_ids(snap.runs)
    active: Dict[str, set] = {}
    for r in snap.runs:
        if r.job_id in packed and r.state in ACTIVE:
            active.setdefault(r.job_id, set()).add(r.idx)
    chosen = {r.idx for r in targets}
    return [r for r in targets if r.job_id in packed and not active.get(r.job_id, set()) <= chosen]


def _stopped_by_their_pack(runs: List[Run]) -> set:
    """Indices of the packed runs whose task has stopped them (a line in their own log), or that are not
    running now (queued, requeued, retrying: their task skips a cancelled run when it starts again); waits
    up to WAIT_S for the running ones."""
    waiting = {r.idx: r for r in runs}
    stopped = {i for i, r in waiting.items() if r.state is not State.RUNNING}
    deadline = time.time() + WAIT_S
    while True:
        for i, r in waiting.items():
            if i not in stopped and r.run_dir and PACKED_CANCELLED in jobs.tail(
                    str(RunPaths(r.run_dir).packed_log), 4096):
                stopped.add(i)
        if len(stopped) == len(waiting) or time.time() > deadline:
            break
        time.sleep(0.5)
    for i in sorted(set(waiting) - stopped):
        print(f"hpctrain cancel: run #{i}: its task has not stopped it yet (packed runs are stopped by their task, "
              f"which reads their record every second)", file=sys.stderr)
    return stopped


def run(sweep_dir: Path, runs: Optional[List[int]] = None) -> int:
    snap = collect(load_sweep(sweep_dir))
    known = {r.idx: r for r in snap.runs}
    unknown = [i for i in runs or [] if i not in known]
    if unknown:
        print(f"hpctrain cancel: error: no run {', '.join(map(str, unknown))} in {sweep_dir} "
              f"(runs: {min(known)}..{max(known)})" if known else f"hpctrain cancel: error: {sweep_dir} has no runs",
              file=sys.stderr)
        return 2
    chosen = [known[i] for i in runs] if runs else snap.runs
    for r in chosen:
        if runs and r.state not in ACTIVE:
            print(f"run #{r.idx} is {r.state}: nothing to cancel")
    targets = [r for r in chosen if r.state in ACTIVE]
    if not targets and not runs and snap.sweep.launcher == "slurm":
        stray = _queued_arrays(sweep_dir)
        if stray:  # tasks of an earlier submission whose runs a later one did
            rc, err = slurm.scancel(stray)
            print(f"no run is queued or running; cancelled job(s) {', '.join(stray)} of an earlier submission"
                  if rc == 0 else f"hpctrain cancel: scancel {' '.join(stray)}: {err}")
            return 0 if rc == 0 else 1
    if not targets:
        print(f"nothing to cancel in {sweep_dir}: no run is queued or running")
        return 0
    if snap.sweep.launcher == "local" and runs and any(r.state is State.QUEUED for r in targets):
        print("hpctrain cancel: error: a local sweep starts its pending runs as slots free up; cancel the whole "
              "sweep (without --run) or the running runs only", file=sys.stderr)
        return 2
    whole = not runs
    by_pack = [] if whole else _left_to_their_pack(snap, targets)
    for r in targets:  # first: what ends now must not be retried (the retry decider reads the record)
        if r.run_dir:
            events.cancelled(r.run_dir, job_id=r.job_id)
    rest = [r for r in targets if r not in by_pack]
    done: Dict[str, int] = {}
    if rest and snap.sweep.launcher == "slurm":
        done = _slurm(snap, rest, whole)
    elif rest:
        done = _local(snap, rest, whole)
    stopped = _stopped_by_their_pack(by_pack)
    for r in targets:
        if r.run_dir and os.path.isdir(r.run_dir):
            summary.write(r.run_dir)
    con = fmt.console()
    for r in targets:
        ok = r.job_id in done or not r.job_id or r.idx in stopped  # no job id: a local run that never started
        con.print(f"  #{r.idx} {escape(fmt.label(r.values, r.overrides))}: was {r.state}, "
                  f"{'cancelled' if ok else '[red]NOT cancelled[/]'}", soft_wrap=True)
    con.print(counts_line(collect(load_sweep(sweep_dir))), soft_wrap=True)
    failed = [r for r in targets if r.job_id and r.job_id not in done and r.idx not in stopped]
    return 1 if failed else 0
