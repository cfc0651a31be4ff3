"""Which point of a grid a pull worker runs next: one lease per point in the claim files of
:mod:`hpctrain.search.claims`, the holder side of :mod:`hpctrain.search.holders` (the search's own).

A pulled submission's leases live in its own claims dir (``<sweep>/.hpctrain/submission-N/points``): a rerun
submits only points no live worker holds (:mod:`hpctrain.submit.rerun`), so two submissions never share a point.
A worker (:meth:`PointLeases.next_point`):

1. first takes back its own point from before a requeue (its alive file names it; the next generation);
2. claims fresh points at generation 1, with no lock and no listing: first its stride (worker ``w`` of ``W``:
   ``w, w + W, ...``, so that workers started together never race for one point), then any point still
   unclaimed (a ``stat`` passes over a claimed one). The claim file is created exclusively: of two
   claimants one wins;
3. once no point is left unclaimed: the points whose alive file still stands are looked at (a holder removes
   its alive file once the point has ended, :meth:`PointLeases.done`): a point released at a time limit is
   resumed, one whose owner is known gone (its job left the queue, its process died) is adopted, the next
   generation of its lease. An owner whose fate is unknown (squeue did not answer) keeps it: ``WAIT``, look
   again; else ``DONE``. Each adoption counts toward ``max_adoptions``.
"""

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Set

from hpctrain.core.liveness import Liveness
from hpctrain.search.claims import ClaimsDir, Mark, alive_path, claim_path, read_leases, touch
from hpctrain.search.holders import Holders, ProcessAnswer, QueueAnswer, Verdict, process_state, slurm_queue
from hpctrain.search.units import Next, Unit


@dataclass
class PullSettings:
    """The lease timings of a grid's pull workers (the search's defaults) and the launcher's retry budget."""

    grace_s: float = 120.0
    heartbeat_s: float = 10.0
    max_adoptions: int = 2  # a point whose worker died this many times ends failed (max_retries + 1)
    max_retries: int = 1


@dataclass
class Point:
    """A point for one worker: generation ``gen`` of its lease."""

    number: int  # the point's place in the submission's point list
    gen: int
    how: str  # new | resumed | adopted
    adoptions: int = 0
    unit: Optional[Unit] = None  # grids run whole points
    previous: Optional[str] = None  # the owner it was taken from (adopted, resumed)


class PointLeases(Holders):
    def __init__(self, claims_dir: ClaimsDir, settings: PullSettings, me: str, fields: Dict[str, Any],
                 n_points: int, worker: int, workers: int, clock: Callable[[], float] = time.time,
                 queue: QueueAnswer = slurm_queue, process: ProcessAnswer = process_state) -> None:
        super().__init__(claims_dir, settings, me, {**fields, "copy": False}, clock, queue, process)
        os.makedirs(claims_dir, exist_ok=True)
        self.n_points = n_points
        self._fresh = self._candidates(worker % max(1, workers), max(1, workers))
        self._started = False

    def _candidates(self, worker: int, workers: int) -> Iterator[int]:
        yield from range(worker, self.n_points, workers)
        yield from range(self.n_points)

    def next_point(self) -> "Point | Next":
        if not self._started:
            self._started = True
            mine = self._take_back()
            if mine is not None:
                return mine
        for number in self._fresh:
            if os.path.exists(claim_path(self.sweep_dir, number, 1)):
                continue  # claimed already: no write needed to find out
            alive = alive_path(self.sweep_dir, number, self.me)
            touch(alive, self.clock())  # before the claim: a holder killed after its claim still has one
            if self._claim(number, 1, 0, None) is not None:
                return Point(number, 1, "new")
            os.unlink(alive)
        got = self._adopt(confirm=False)
        if got is Next.DONE and self._beating_alive:
            got = self._adopt(confirm=True)  # the last look asks the queue about owners beating
        return got

    def _alive_numbers(self, owner: Optional[str] = None) -> Set[int]:
        """The points with an alive file standing (of ``owner`` alone, if given): held, or left by a dead owner."""
        suffix = f".{owner.replace('/', '_')}.alive" if owner is not None else ".alive"
        out = set()
        for name in os.listdir(self.sweep_dir):
            head = name.split(".", 1)[0]
            if name.endswith(suffix) and head.isdigit():
                out.add(int(head))
        return out

    def _take_back(self) -> Optional[Point]:
        """This worker's own point from before a requeue: the next generation of its lease."""
        numbers = self._alive_numbers(self.me)
        for number, lease in sorted(read_leases(self.sweep_dir, self.claims, only=numbers).items()):
            if lease.owner == self.me and lease.mark is Mark.HELD:
                if self._claim(number, lease.gen + 1, lease.adoptions, None) is not None:
                    return Point(number, lease.gen + 1, "resumed", lease.adoptions, previous=self.me)
        return None

    def _adopt(self, confirm: bool) -> "Point | Next":
        numbers = self._alive_numbers()
        leases = read_leases(self.sweep_dir, self.claims, only=numbers)
        seen = self.look_at(sorted(leases), leases, confirm)
        self._beating_alive = any(f.beating and f.state is Liveness.ALIVE for f in seen.values())
        undecided = False
        for number, lease in sorted(leases.items()):
            if lease.owner == self.me and lease.mark is Mark.HELD:
                continue  # ours: running here (never: a worker runs one point at a time)
            verdict = Verdict.RESUME if lease.mark is Mark.RELEASED else self.owner_verdict(lease, seen.get(number))
            if verdict is Verdict.LOOK_AGAIN:
                undecided = True
            elif verdict in (Verdict.RESUME, Verdict.ADOPT):
                adoptions = lease.adoptions + (verdict is Verdict.ADOPT)
                if self._claim(number, lease.gen + 1, adoptions, None) is not None:
                    self._unlink(number, lease.owner)  # its owner is gone: no later look takes the point up again
                    return Point(number, lease.gen + 1, "adopted", adoptions, previous=lease.owner)
        return Next.WAIT if undecided else Next.DONE

    _beating_alive = False

    def done(self, p: Point) -> None:
        """The point has ended (or was found ended): its alive file goes, so no later look takes it up."""
        self._unlink(p.number, self.me)

    def _unlink(self, number: int, owner: str) -> None:
        try:
            os.unlink(alive_path(self.sweep_dir, number, owner))
        except FileNotFoundError:
            pass
