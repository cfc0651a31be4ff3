"""One holder's side of the claim files (:mod:`hpctrain.search.claims`), whatever is claimed: a search's
trials (:mod:`hpctrain.search.leases`) or a grid's points (:mod:`hpctrain.search.points`).

A holder claims generations of leases for itself, beats while it holds one, lets one go (released at a time
limit), and finds out, under no lock, whether the owners of others' leases still live: one ``squeue`` for the
Slurm jobs not beating, a process check for local owners (:mod:`hpctrain.core.liveness`). A failed query is
*unknown*, never gone. :meth:`Holders.owner_verdict` turns what it found into what may be done with a lease.
No optuna here (a grid's workers never import it).
"""

import os
import socket
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Set

from hpctrain.core import liveness
from hpctrain.core.liveness import Liveness
from hpctrain.search.claims import Claims, Lease, Mark, alive_path, claim, claim_path, heartbeat_age, read_claim, \
    touch, trials_lock
from hpctrain.search.units import Unit

QueueAnswer = Callable[[List[str]], Optional[Set[str]]]  # the job ids still in the queue; None: unknown
ProcessAnswer = Callable[[int, float], Liveness]  # (pid, a time it ran) -> its state


def slurm_queue(job_ids: List[str]) -> Optional[Set[str]]:
    """The jobs of ``job_ids`` still in Slurm's queue; None when squeue could not answer. The one squeue
    call of the protocol, asked of the batch script's host side inside a job (the worker may run in an image
    without Slurm): :func:`hpctrain.slurm.host.squeue`."""
    from hpctrain.slurm import host
    from hpctrain.slurm import parse as slurm_parse

    queue = host.squeue(job_ids)
    if queue is None:
        return None
    return {j for j in job_ids if slurm_parse.in_queue(queue, j)}


def process_state(pid: int, started_by: float) -> Liveness:
    """A local worker's process (:func:`hpctrain.core.liveness.process`): it ran when it claimed."""
    return liveness.process(pid, started_by=started_by)


class Times(Protocol):
    """The lease timings a holder reads (a search's Settings, a grid's PullSettings)."""

    grace_s: float
    heartbeat_s: float
    max_adoptions: int


class Held(Protocol):
    """What a holder holds: generation ``gen`` of lease ``number``."""

    number: int
    gen: int
    adoptions: int
    unit: Optional[Unit]


@dataclass
class Seen:
    """What :meth:`Holders.look_at` found out about a lease's owner, outside the lock."""

    gen: int
    state: Liveness
    beating: bool = False  # its heartbeat was fresh: ALIVE by that alone, or GONE although fresh (asked anyway)


class Verdict(Enum):
    """What a worker may do with another's running trial, from its lease and what the look found."""

    LEAVE = "leave"  # its owner runs it (or it rests between units, or it is ours)
    LOOK_AGAIN = "look again"  # its owner's fate is unknown, or it changed hands since the look
    FINISH_ENDING = "finish ending"  # its ender died between the ended claim and the tell
    RESUME = "resume"  # released at a time limit: anyone resumes it, no adoption counted
    ADOPT = "adopt"  # its owner is known gone


class Holders:
    """One holder of leases in ``sweep_dir``'s claim files (a sweep dir, or a :class:`ClaimsDir`).
    ``clock``, ``queue`` and ``process`` are what the tests replace: no real sleeping, no real squeue."""

    def __init__(self, sweep_dir: "str | Path", settings: Times, me: str, fields: Dict[str, Any],
                 clock: Callable[[], float] = time.time, queue: QueueAnswer = slurm_queue,
                 process: ProcessAnswer = process_state) -> None:
        self.sweep_dir, self.settings, self.me, self.fields = sweep_dir, settings, me, fields
        self.clock, self.queue, self.process = clock, queue, process
        self.gone_jobs: Set[str] = set()  # a job the queue answered without: gone for good (a requeue keeps its id queued)
        self.claims: Claims = {}  # claim files read so far (read_leases)

    # ------------------------------------------------------------ facts, outside the lock
    def _window(self) -> float:
        s = self.settings
        return min(s.grace_s, 3 * s.heartbeat_s)

    def _age(self, lease: Lease) -> float:
        return heartbeat_age(self.sweep_dir, lease.number, lease.owner, self.clock())

    def look_at(self, numbers: Iterable[int], leases: Dict[int, Lease], confirm: bool = False) -> Dict[int, Seen]:
        """The state of the owner of each lease of ``numbers`` that is not this holder's; slow calls (one
        squeue for all the jobs, process checks) are made here, under no lock. ``confirm``: ask the queue
        about beating Slurm owners too (a killed job's heartbeat stays fresh for a few seconds)."""
        seen: Dict[int, Seen] = {}
        ask: Dict[int, str] = {}
        beating: Dict[int, bool] = {}
        for number in numbers:
            lease = leases.get(number)
            if lease is None or lease.owner == self.me or lease.mark.resting:
                continue
            beating[number] = self._age(lease) < self._window()
            state = self._without_queue(lease, confirm)
            if state is None:
                ask[number] = str(lease.slurm_job_id)
            else:
                seen[number] = Seen(lease.gen, state, beating[number])
        if ask:
            in_queue = self.queue(sorted(set(ask.values())))
            for number, job in ask.items():
                if in_queue is None:
                    state = Liveness.UNKNOWN  # a failed query: unknown, never gone
                elif job in in_queue:
                    state = Liveness.ALIVE
                else:
                    self.gone_jobs.add(job)
                    state = Liveness.GONE
                seen[number] = Seen(leases[number].gen, state, beating[number])
        return seen

    def _without_queue(self, lease: Lease, confirm: bool = False) -> Optional[Liveness]:
        """The owner's state when the queue need not be asked; None: ask it."""
        if lease.mark is Mark.RELEASED:
            return Liveness.GONE  # let go at a time limit: resumable at once, no adoption counted
        if lease.local and self.process(int(lease.pid or 0), lease.since) is Liveness.GONE:
            return Liveness.GONE  # a dead process beats no more: no need to wait for its heartbeat to age
        age = self._age(lease)
        if age < self._window() and not (confirm and lease.slurm_job_id):
            return Liveness.ALIVE  # beating: alive, whatever the queue says
        if lease.slurm_job_id:
            return Liveness.GONE if lease.slurm_job_id in self.gone_jobs else None
        if lease.local:
            return self.process(int(lease.pid or 0), lease.since)
        # nobody can be asked about this owner: its heartbeat is all there is
        return Liveness.GONE if age > self.settings.grace_s else Liveness.UNKNOWN

    def owner_verdict(self, lease: Lease, fact: Optional[Seen]) -> Verdict:
        """What may be done with another's held lease, from what the look found of its owner."""
        if lease.owner == self.me:
            return Verdict.LEAVE  # ours, and someone claimed it again first
        if fact is None or fact.gen != lease.gen or fact.state is Liveness.UNKNOWN:
            return Verdict.LOOK_AGAIN  # not looked at, or changed hands since: look again
        if fact.state is Liveness.ALIVE:
            return Verdict.LEAVE
        dead = fact.beating or (not lease.slurm_job_id and lease.host == socket.gethostname())
        if not dead and self._age(lease) < self._window():
            return Verdict.LEAVE  # it beat since we looked (a requeued job, running again)
        return Verdict.ADOPT

    # ------------------------------------------------------------ the holder's side
    def _claim(self, number: int, gen: int, adoptions: int, unit: Optional[Unit], mark: Mark = Mark.HELD,
               step: Optional[int] = None) -> Optional[Lease]:
        """Generation ``gen`` of lease ``number``, for this holder."""
        return claim(self.sweep_dir, number, gen, self.me, self.clock(), adoptions=adoptions, unit=unit, mark=mark,
                     step=step, **self.fields)

    def holds(self, a: Held) -> bool:
        """Whether generation ``a.gen`` is still the lease's newest and this holder's. Generations are claimed
        one after the other (each the next of one read), so a newer one exists exactly when ``gen + 1`` does."""
        if os.path.exists(claim_path(self.sweep_dir, a.number, a.gen + 1)):
            return False
        path = claim_path(self.sweep_dir, a.number, a.gen)
        lease = self.claims.get(path) or read_claim(path, a.number, a.gen)
        if lease is not None:
            self.claims[path] = lease
        return lease is not None and lease.owner == self.me and lease.mark is Mark.HELD

    def beat(self, a: Held) -> None:
        touch(alive_path(self.sweep_dir, a.number, self.me), self.clock())

    def release(self, a: Held) -> bool:
        """Let the lease go unfinished (a time limit): the next worker resumes it, no adoption counted."""
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return self._claim(a.number, a.gen + 1, a.adoptions, a.unit, mark=Mark.RELEASED) is not None
