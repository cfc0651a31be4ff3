"""Ctrl-C or SIGTERM on the local launcher: its runs cancelled as ``hpctrain cancel`` does, in one line.

A terminal's Ctrl-C goes to the whole foreground process group; the runs are started deaf to it
(:func:`deaf_children`: SIGINT ignored, which their processes inherit), so the launcher alone decides.
On the first SIGINT or SIGTERM (:class:`Interrupts`) every active run of the submission gets ``cancelled``
in its record (nothing is retried or left queued), each running task is asked to checkpoint (submitit's
preemption signal: hpctrain's trainer saves at its next step and, its record being final, exits instead of
requeueing), and a task still going after the grace time, or at a second Ctrl-C, is stopped
(:func:`hpctrain.core.stopping.end_runs`). Then one line and the exit status a shell gives a process that
signal ended: 130 for SIGINT, 143 for SIGTERM. The same command again resumes the runs from their checkpoints
(a cancelled run is neither completed nor queued: :mod:`hpctrain.submit.rerun` submits it again). A search's
runs are its workers: each, finding itself cancelled, records its trial ``cancelled`` and releases it
(:mod:`hpctrain.search.worker`), and the same command again resumes those trials.
"""

import signal
import sys
import threading
import types
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence

from hpctrain._compat.submitit import preemption_signal
from hpctrain.core import events, stopping, summary
from hpctrain.core.run import RunSpec

NAMES: Dict[int, str] = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class Interrupts:
    """SIGINT and SIGTERM recorded (not raised) while the launcher waits on its runs; restored on exit."""

    def __init__(self) -> None:
        self.signals: List[int] = []
        self._previous: dict = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in NAMES:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _record(self, signum: int, frame: Optional[types.FrameType]) -> None:
        self.signals.append(signum)

    @property
    def first(self) -> Optional[int]:
        return self.signals[0] if self.signals else None


@contextmanager
def deaf_children() -> Iterator[None]:
    """Processes started inside ignore SIGINT (inherited through fork and exec; Python then installs no
    KeyboardInterrupt handler). SIGINT is blocked meanwhile, so a Ctrl-C in this window reaches the launcher's
    handler once it is back instead of being ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def cancel(interrupts: Interrupts, running: Sequence[Any], runs: Sequence[RunSpec], sweep_dir: Any,
           search: bool = False) -> None:
    """The launcher was interrupted: ``runs`` (its active runs) cancelled, the ``running`` submitit jobs asked
    to checkpoint, then stopped; one line, then exit; never returns. ``search``: the runs are a search's workers
    (their placeholders), each of which, seeing itself cancelled, records its trial ``cancelled`` and releases it
    (:mod:`hpctrain.search.worker`)."""
    signum = interrupts.first or signal.SIGINT
    name = NAMES.get(signum, f"signal {signum}")
    by = f"{name} on the launcher"
    for run in runs:
        try:
            if not events.read(run.run_dir).final:  # first: what ends now is not retried (attempt_ended reads it)
                events.cancelled(run.run_dir, by=by)
        except OSError:
            pass
    n_running = len({str(job.job_id) for job in running})
    again = '; Ctrl-C again to stop them now' if n_running and signum == signal.SIGINT else ''
    if search:
        print(f"hpctrain: {name}: cancelling the search ({n_running} worker(s) running: each checkpoints its trial, "
              f"then stops{again}); the same command again resumes the study", file=sys.stderr, flush=True)
    else:
        print(f"hpctrain: {name}: cancelling {len(runs)} run(s) ({n_running} running: each checkpoints, then stops"
              f"{again}); the same command again resumes them", file=sys.stderr, flush=True)
    left = stopping.end_runs([str(job.job_id) for job in running], preemption_signal(),
                             hurry=lambda: len(interrupts.signals) > 1)
    for run in runs:
        try:
            summary.write(run.run_dir)
        except OSError:
            pass
    for job_id in left:
        print(f"hpctrain: the run with job id {job_id} did not stop (pid {job_id}); python -m hpctrain cancel "
              f"{sweep_dir}", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)
