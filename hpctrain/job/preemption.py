"""Take submitit's preemption/timeout signal at a step boundary.

submitit handles USR2 (sent before the time limit, or on preemption) by calling the job's
``checkpoint()`` and requeueing at once, from inside the signal handler, which can land in the middle
of an optimizer step. The guard below only records the signal; the trainer, which holds it among its hooks
(hpctrain.train.hooks), checks it at step boundaries (all ranks agree on the step), saves a consistent
checkpoint on rank 0, and then hands the signal to submitit's own handler, which requeues and exits.

A preemption can also come as SIGTERM with a grace time (``PreemptMode=REQUEUE`` or ``CANCEL`` with
``GraceTime``, no user signal), which submitit ignores. A user's ``scancel``, the time limit and a requeue
send SIGTERM too; Slurm tells them apart by the job's state: those have ended the job (COMPLETING,
CANCELLED, TIMEOUT, REQUEUED) by the time they signal, while a preemption's grace time (and
``scancel --signal=TERM``) leaves it RUNNING, with ``PreemptTime`` set for a preemption. So on a SIGTERM
rank 0 asks Slurm once (:func:`term_meaning_now`): a running job is treated as USR2 (checkpoint,
``requeued``, requeue); anything else, or no answer, is the end (:attr:`Term.END`): the run stops at the
next step as it would at a preemption, but exits instead of requeueing, at once rather than at the SIGKILL
``KillWait`` later (submitit's own handler ignores SIGTERM). Rank 0 alone asks: the trainer's agreed stop flag
takes its decision to the other ranks. A preemption without a grace time
(or at the grace time's end) is a requeue by Slurm itself: COMPLETING with ``Restarts`` above this attempt's
``SLURM_RESTART_COUNT`` (:attr:`Term.REQUEUED`). Its SIGKILL follows ``KillWait`` later (30 s by default):
time for the checkpoint and ``requeued`` as on USR2, but no ``scontrol requeue``, the job is requeued already.

Slurm is never called from here: the job step may run in an image without a Slurm client. The question and
the requeue are asked of the batch script's host-side helper (:mod:`hpctrain.slurm.host`); a requeue it could
not make raises :class:`RequeueFailed`, whose message the record's fold reads (the run is failed, not requeued).
"""

import os
import signal
import sys
import time
import types
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from hpctrain.core.state import REQUEUE_FAILED

TERM_BY_PARENT_ENV = "HPCTRAIN_TERM_BY_PARENT"  # a packed run: the task's parent decides what a SIGTERM means
END_EXIT = 128 + signal.SIGTERM  # a run ended by the job's end (a cancel, the time limit), as a shell counts a TERM


class Term(Enum):
    """What a SIGTERM to a Slurm job step means, from the job's state when it came."""

    PREEMPTION = "preemption"  # the job runs on (a grace time, scancel --signal=TERM): checkpoint and requeue
    REQUEUED = "requeued"  # Slurm requeued the job itself (preempted without grace time): the SIGKILL follows
    END = "end"  # the job ended (scancel, the time limit): the TERM ends the run


class RequeueFailed(RuntimeError):
    """The host side could not requeue the job: the attempt ends failed (retried where the budget allows)."""

    def __init__(self, error: str) -> None:
        super().__init__(f"{REQUEUE_FAILED}: {error}")


class PreemptionGuard:
    def __init__(self, run_dir: Optional[Path] = None) -> None:
        self.run_dir = run_dir  # where the end of the job is recorded (cancelled, timeout); None: not recorded
        self.requested = False
        self.slurm_requeued = False  # Slurm requeued the job itself: checkpoint, but no scontrol requeue
        self.term_at: Optional[float] = None  # a SIGTERM came, not yet told apart (a preemption or a cancel)
        self._signum: Optional[int] = None
        self._previous: Optional[Callable[..., Any]] = None
        self._previous_term: Any = None

    def install(self) -> "PreemptionGuard":
        if not os.environ.get("SUBMITIT_EXECUTOR"):
            return self  # not a submitit job: nobody will requeue us
        from hpctrain._compat.submitit import preemption_signal

        self._signum = preemption_signal()
        previous = signal.getsignal(self._signum)
        if callable(previous):
            self._previous = previous
            signal.signal(self._signum, self._record)
            if decides_term():
                self._previous_term = signal.signal(signal.SIGTERM, self._record_term)
        return self

    def _record(self, signum: int, frame: Optional[types.FrameType]) -> None:
        self.requested = True

    def _record_term(self, signum: int, frame: Optional[types.FrameType]) -> None:
        self.term_at = time.time()  # told apart at the next step, not in the handler (a subprocess)

    def _term_decided(self) -> bool:
        """Whether a SIGTERM came that stops the run here (its meaning asked once per SIGTERM): a preemption or
        Slurm's requeue (checkpoint, requeue); the end of the job exits at once (:meth:`end_now`)."""
        if self.term_at is None:
            return False
        self.term_at = None
        meaning, job = term_now()
        if meaning is Term.PREEMPTION:
            print("hpctrain: SIGTERM with the job still running (a preemption's grace time): checkpoint and "
                  "requeue as on USR2", file=sys.stderr, flush=True)
        elif meaning is Term.END:
            self.end_now(job)
        self.slurm_requeued = meaning is Term.REQUEUED
        return True

    def end_now(self, job: Dict[str, str]) -> None:
        """The job ends (a cancel, the time limit): recorded where Slurm said which, then exit at once, no
        checkpoint (the SIGKILL would come ``KillWait`` later; submitit ignores the SIGTERM itself)."""
        end = ended_as(job)
        print(f"hpctrain: SIGTERM ends the job ({end or 'Slurm did not say why'}): the run stops now, no requeue",
              file=sys.stderr, flush=True)
        if self.run_dir is not None and end is not None:
            from hpctrain.core import events, summary

            try:
                if events.read(self.run_dir).final:  # `hpctrain cancel` wrote it before its scancel
                    pass
                elif end == "cancelled":
                    events.cancelled(self.run_dir, by="Slurm (scancel)", job_id=os.environ.get("SLURM_JOB_ID"))
                else:
                    events.timed_out(self.run_dir, "the job reached its time limit (Slurm's SIGTERM) and was not "
                                                   "requeued")
                summary.write(self.run_dir)
            except OSError as exc:
                print(f"hpctrain: the end of the job cannot be recorded: {exc}", file=sys.stderr, flush=True)
        sys.exit(END_EXIT)

    def hand_over(self) -> None:
        """Let submitit requeue (rank 0) and exit; never returns."""
        assert self._previous is not None and self._signum is not None
        if self.slurm_requeued:
            from hpctrain._compat.submitit import checkpoint_for_requeue

            checkpoint_for_requeue(self._previous)  # the job's checkpoint() and pickle: no scontrol requeue
            sys.exit(0)
        requeue_with(self._previous, self._signum)  # rank 0: checkpoint(), the host side's requeue, sys.exit
        sys.exit(0)  # other ranks: submitit's handler returns; their work is done

    def uninstall(self) -> None:
        """Restore submitit's handler (a signal after the last step is moot: the run is done)."""
        if self._previous is not None and self._signum is not None:
            signal.signal(self._signum, self._previous)
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous_term = None

    # ------------------------------------------------------------------ the trainer's hook protocol
    def on_start(self, step: int) -> None:
        self.install()

    def should_stop(self, step: int) -> bool:
        if not self.requested and self.term_at is not None and self._term_decided():  # decided once
            self.requested = True
        return self.requested

    def on_stop(self, step: int) -> None:
        self.hand_over()

    def on_eval(self, step: int, metrics: Any) -> None:
        return None

    def on_end(self, step: int, status: Any) -> None:
        self.uninstall()


def requeue_with(handler: Callable[..., Any], signum: int) -> None:
    """Call submitit's handler (``checkpoint()``, the requeue, exit) with SIGTERM ignored; the requeue is
    asked of the host side (:func:`requeue_on_host`), never by submitit's own ``scontrol`` in this process.

    The requeue makes Slurm SIGTERM every process of the job: ignored here until the handler exits
    (docs/decisions.md, 2026-12-01)."""
    from hpctrain._compat.submitit import requeue_through

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":  # the local executor's requeue is its exit code
            requeue_through(handler, requeue_on_host)
        handler(signum, None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def requeue_on_host(countdown: int = 0) -> None:
    """``scontrol requeue`` of this job, run by the batch script's helper; :class:`RequeueFailed` if not done."""
    from hpctrain.slurm import host

    ans = host.requeue()
    if ans.stdout is None:
        print(f"hpctrain: {REQUEUE_FAILED}: {ans.error}", file=sys.stderr, flush=True)
        raise RequeueFailed(ans.error)
    print(f"hpctrain: requeued by the host side ({countdown} remaining timeouts)", file=sys.stderr, flush=True)


def decides_term() -> bool:
    """Whether this process tells a SIGTERM apart: global rank 0 of a Slurm job, not a packed run's child."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return bool(os.environ.get("SLURM_JOB_ID")) and rank == "0" and not os.environ.get(TERM_BY_PARENT_ENV)


def term_meaning_now(job_id: Optional[str] = None, timeout_s: float = 15.0) -> Term:
    """What the SIGTERM this job got means (:func:`term_now`)."""
    return term_now(job_id, timeout_s)[0]


def term_now(job_id: Optional[str] = None, timeout_s: float = 15.0) -> Tuple[Term, Dict[str, str]]:
    """What the SIGTERM this job got means, asked of Slurm on the host side (:func:`term_meaning`), and the
    job's fields as Slurm gave them. No answer counts as the end: the TERM then ends the job."""
    from hpctrain.slurm import host, parse

    job_id = job_id or os.environ.get("SLURM_JOB_ID", "")
    if not job_id:
        return Term.END, {}
    # Slurm's own requeue sends a second SIGTERM to every process of the job while we wait for the answer
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        ans = host.show_job(timeout_s=timeout_s)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if ans.stdout is None:
        print(f"hpctrain: SIGTERM, and Slurm cannot say whether the job is preempted ({ans.error}): "
              f"taken as the end of the job", file=sys.stderr, flush=True)
        return Term.END, {}
    lines = [ln for ln in ans.stdout.splitlines() if ln.strip()]
    job = parse.parse_fields(lines[0]) if lines else {}
    meaning = term_meaning(job, restarts_so_far()) if lines else Term.END
    if meaning is Term.REQUEUED:
        print("hpctrain: SIGTERM with the job already requeued by Slurm (a preemption without grace time): "
              "checkpoint before its SIGKILL, no requeue of our own", file=sys.stderr, flush=True)
    return meaning, job


def restarts_so_far() -> int:
    """This attempt's ``SLURM_RESTART_COUNT`` (unset on the first attempt)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def ended_as(job: Dict[str, str]) -> Optional[str]:
    """How a job that ends (:attr:`Term.END`) ended, from its ``scontrol show job -o`` fields: ``"timeout"``
    (its time limit: Reason=TimeLimit while it completes), ``"cancelled"`` (a plain scancel: COMPLETING with no
    reason, or CANCELLED), None where Slurm does not say (no answer, a node failure, already PENDING)."""
    state, reason = job.get("JobState", "").split("+")[0], job.get("Reason", "")
    if state == "TIMEOUT" or (state == "COMPLETING" and reason == "TimeLimit"):
        return "timeout"
    if state == "CANCELLED" or (state == "COMPLETING" and reason == "None"):
        return "cancelled"
    return None


def term_meaning(job: Dict[str, str], restarts: int) -> Term:
    """From ``scontrol show job -o`` fields: RUNNING (a preemption's grace time, ``scancel --signal=TERM``)
    or PREEMPTED is a preemption; COMPLETING with ``Restarts`` above this attempt's ``restarts`` is Slurm's
    own requeue of a preemption; anything else ended the job: ``scancel``, the time limit (COMPLETING with
    the same ``Restarts``, CANCELLED, TIMEOUT...), a node taken down under it (already PENDING again: the
    record keeps no word of it, so status says Slurm requeued it)."""
    state = job.get("JobState", "").split("+")[0]
    if state in ("RUNNING", "PREEMPTED"):
        return Term.PREEMPTION
    try:
        requeued = int(job.get("Restarts", "0")) > restarts
    except ValueError:
        requeued = False
    if requeued and state == "COMPLETING":
        return Term.REQUEUED
    return Term.END
