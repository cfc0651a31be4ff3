"""A search's time left, from its trials' measured pace: the units of work still to run (a unit: one stretch
of one trial, :mod:`hpctrain.search.units`), each taking a fixed time besides its steps (start-up or resume,
the last evaluation, the checkpoint) plus its steps at the seconds a step takes, run by the search's workers.

The pace (:func:`pace`), measured in the units that ran: the seconds a step takes inside a unit (between two
progress writes of one unit, its evaluations included), and the time a unit takes besides its steps (the
median, over the units that ended, of their time less their steps at that pace: a worker's first unit pays
the imports once, a straggler is one unit). Both over the last third of the time measured, or the last few
measurements where fewer fall there: a shared machine's speed moves several-fold within a search
(benchmarks/README.md). A count of steps per second over all the time instead takes a search of short units
(early ASHA: many trials to the first rung) as the speed of the long ones still to come, and the other way
round at the end.

The units still to run and the time their workers take (:func:`eta_s`): PBT and no scheduler: each trial's
steps to ``max_steps`` in units (PBT: one per interval; a pruner may stop some earlier: the ETA is then an
upper bound), spread over the workers as they free up. ASHA: the search played on from where it is, as
:mod:`hpctrain.search.asha` decides, ``SAMPLES`` times (seeded: the same state gives the same ETA), each play
timed unit by unit on its workers (a worker waits while nothing is promotable and the trials have all started:
the tail, when fewer workers are busy); the mean of the plays. A running unit: what is left of its time
(the time it has run counted), at least its steps still to train. Hyperband (its brackets taken as the
first): rung by rung, the trials expected to reach it minus those that did, times the stretch below it
(every trial reaches the first rung; of the trials at a rung, the share that went on to the next as measured
so far, ``1/eta`` until ``eta`` trials got there or where fewer went on); their time over the workers.

Async ASHA promotes more than ``1/eta`` of a rung (11 of 27 on the README's example) and how many depends on
the order the values arrive, so no share measured early predicts it; the rule does, and once every trial
started it ends the search where the real one ends. A trial's quality is one draw for all its rungs (the
rungs rank trials alike); the trials there already get the best draws in the order of how far they went,
those still to come fresh ones.

Pure: the caller reads the trials and their records (the launcher's progress display). No torch, no Optuna.
"""

import heapq
import random
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpctrain.search.asha import rungs

PROMOTING = ("asha", "hyperband")
SAMPLES = 48  # plays of the rest of an ASHA search: the mean's spread is a few % of it
RECENT = 3  # measurements taken at least, where fewer fall in the last third of the time
OUTLIER = 3.0  # without strides: units slower a step than this many times the median are left out


@dataclass(frozen=True)
class Trial:
    step: int  # steps trained so far (0: not started)
    final: bool  # completed, pruned or failed: nothing more to train
    paused: bool = False  # at a rung (or PBT interval) it reached: its next stretch only if it is promoted
    running_s: float = 0.0  # seconds its unit under way has run so far (its start-up included)


@dataclass(frozen=True)
class Span:
    """One unit that ended: from its start record to its end record (paused, completed, pruned)."""

    start_s: float
    end_s: float
    steps: int


@dataclass(frozen=True)
class Stride:
    """Steps one running unit trained between two of its progress writes, and the seconds between them."""

    end_s: float
    seconds: float
    steps: int


@dataclass(frozen=True)
class Pace:
    step_s: float  # seconds a step takes inside a unit, its evaluations included
    unit_s: float = 0.0  # seconds a unit takes besides its steps

    def unit(self, steps: float) -> float:
        return self.unit_s + self.step_s * steps

    def running(self, steps_to_go: float, unit_steps: float, running_s: float) -> float:
        """What is left of a running unit's time: its whole time less what it ran, at least its steps to go."""
        return max(self.step_s * steps_to_go, self.unit(unit_steps) - running_s)


def _recent(items: Sequence[Any], key: Any, since: float) -> List[Any]:
    ordered = sorted(items, key=key)
    kept = [x for x in ordered if key(x) >= since]
    return kept if len(kept) >= RECENT else ordered[-RECENT:]


def pace(spans: Sequence[Span], strides: Sequence[Stride], first_units: int = 0) -> Optional[Pace]:
    """The pace over the last third of the time the measurements cover (at least the last ``RECENT`` of
    each); without strides (an app that writes no progress within a unit) the units' time over their steps,
    nothing besides. The ``first_units`` units that started first (one a worker) pay the worker's imports (on a
    quiet machine 3.3 s for 20 steps that take 0.2 s in its next units): left out, as is, without strides, a unit
    ``OUTLIER`` times slower a step than the median of the others (a worker started later). None before any
    step was measured."""
    times = [s.start_s for s in spans] + [s.end_s for s in spans] + [s.end_s - s.seconds for s in strides] \
        + [s.end_s for s in strides]
    if not times:
        return None
    since = max(times) - (max(times) - min(times)) / 3
    later = sorted(spans, key=lambda s: s.start_s)[max(0, first_units):]
    ended = _recent([s for s in later if s.steps > 0 and s.end_s > s.start_s], lambda s: s.end_s, since)
    inside = _recent([s for s in strides if s.steps > 0 and s.seconds > 0], lambda s: s.end_s, since)
    if inside:
        step_s = sum(s.seconds for s in inside) / sum(s.steps for s in inside)
    elif ended:
        typical = statistics.median((s.end_s - s.start_s) / s.steps for s in ended)
        kept = [s for s in ended if (s.end_s - s.start_s) / s.steps <= OUTLIER * typical]
        return Pace(sum(s.end_s - s.start_s for s in kept) / sum(s.steps for s in kept))
    else:
        return None
    besides = [max(0.0, s.end_s - s.start_s - step_s * s.steps) for s in ended]
    return Pace(step_s, statistics.median(besides) if besides else 0.0)


def steps_left(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any]) -> float:
    """The search's steps still to train: its trials in flight from where they are, the trials to come whole."""
    return _left(list(trials), n_trials, search, Pace(1.0))[0]


def eta_s(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any],
          measured: Optional[Pace]) -> Optional[float]:
    """Seconds left at the pace measured (:func:`pace`); None without one."""
    if measured is None or measured.step_s <= 0:
        return None
    return _left(list(trials), n_trials, search, measured)[1]


def _left(known: List[Trial], n_trials: Optional[int], search: Mapping[str, Any], p: Pace) -> Tuple[float, float]:
    """(steps still to train, seconds the workers still take)."""
    n = max(int(n_trials or 0), len(known))
    max_steps = int(search.get("max_steps") or 0)
    if max_steps <= 0:
        return 0.0, 0.0
    workers = max(1, min(int(search.get("workers") or 1), n))
    if search.get("scheduler") not in PROMOTING:
        return _units_left(known, n, max_steps, int(search.get("interval") or max_steps)
                           if search.get("scheduler") == "pbt" else max_steps, workers, p)
    eta, first = int(search.get("eta") or 3), int(search.get("min_steps") or 0)
    ladder: List[int] = rungs(first, eta, max_steps) if 0 < first < max_steps and eta >= 2 else [max_steps]
    if search.get("scheduler") == "asha" and len(ladder) > 1:
        plays = random.Random(len(known) * 7919 + sum(t.step for t in known))
        done = [_play(known, n, ladder, eta, workers, p, plays) for _ in range(SAMPLES)]
        return sum(d[0] for d in done) / SAMPLES, sum(d[1] for d in done) / SAMPLES
    left, expected, below, units, fresh, running = 0.0, float(n), 0, 0.0, 0.0, 0.0
    for k, rung in enumerate(ladder):
        reached = sum(t.step >= rung for t in known)
        heading = [t for t in known if not t.final and not t.paused and below <= t.step < rung]
        if k > 0:  # the share of the last rung's trials that went on: as measured once a few reached it
            at_last = sum(t.step >= below for t in known)
            share = (reached + len(heading)) / at_last if at_last >= eta else 0.0
            expected *= max(share, 1.0 / eta)
        expected = max(expected, float(reached + len(heading)))  # those heading there get there
        left += (expected - reached) * (rung - below) - sum(t.step - below for t in heading)
        units += expected - reached - len(heading)  # units still to start: their steps, and their time besides
        fresh += (expected - reached - len(heading)) * (rung - below)
        running += sum(p.running(rung - t.step, rung - below, t.running_s) for t in heading)
        below = rung
    return max(0.0, left), max(0.0, (p.step_s * fresh + p.unit_s * units + running) / workers)


def _units_left(known: List[Trial], n: int, max_steps: int, interval: int, workers: int,
                p: Pace) -> Tuple[float, float]:
    """No scheduler (one unit a trial) or PBT (one a member and interval): the steps to ``max_steps``, and the
    time the workers take for them: the units under way first, then the rest in order (PBT: interval by
    interval, the population's generations), each to the worker that frees up first."""
    interval = max(1, min(interval, max_steps))
    busy: List[float] = []
    queue: List[Tuple[int, float]] = []  # (the interval's boundary, its time): run in boundary order
    steps = 0.0
    trials = known + [Trial(0, False, True)] * (n - len(known))  # those to come: waiting at step 0
    for t in trials:
        if t.final or t.step >= max_steps:
            continue
        steps += max_steps - t.step
        at = t.step
        if not t.paused:  # under way: the rest of its unit
            end = min(max_steps, (at // interval + 1) * interval)
            busy.append(p.running(end - at, end - (end - 1) // interval * interval, t.running_s))
            at = end
        while at < max_steps:
            end = min(max_steps, (at // interval + 1) * interval)
            queue.append((end, p.unit(end - at)))
            at = end
    return steps, _makespan(busy, [d for _, d in sorted(queue, key=lambda q: q[0])], workers)


def _makespan(busy: List[float], queued: List[float], workers: int) -> float:
    """When the last of the units ends: those under way on their workers, then each queued one in order on
    the worker that frees up first."""
    free = sorted(busy) + [0.0] * max(0, workers - len(busy))
    heapq.heapify(free)
    end = max(free, default=0.0)
    for d in queued:
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def _play(known: List[Trial], n: int, ladder: List[int], eta: int, workers: int, p: Pace,
          rng: random.Random) -> Tuple[float, float]:
    """One play of the rest of an ASHA search: (the steps it trains, the seconds it takes). Its workers, each
    free one promoting the best paused trial in the top ``1 // eta`` of its rung (highest rung first), else
    starting a trial, else waiting for a running unit to end."""
    last = len(ladder) - 1

    def height(t: Trial) -> float:  # rungs reached, and half a rung more while it trains towards the next
        return sum(t.step >= r for r in ladder) + (0.5 if not t.final and not t.paused else 0.0)

    order = sorted(range(len(known)), key=lambda i: (-height(known[i]), rng.random()))
    draws = sorted(rng.random() for _ in known)
    quality = [0.0] * len(known)
    for i, q in zip(order, draws):
        quality[i] = q  # lower is better: the trials that went furthest the best
    step = [t.step for t in known]
    # rung: the last rung index a trial reached (-1: none); aim: the rung it trains towards (None: not running)
    rung = [sum(s >= r for r in ladder) - 1 for s in step]
    aim: List[Optional[int]] = [None if t.final or t.paused else min(rung[i] + 1, last) for i, t in enumerate(known)]
    done = [t.final or (rung[i] == last) for i, t in enumerate(known)]
    left = [0.0] * len(known)  # seconds a running unit still takes
    trained, started, clock = 0.0, len(known), 0.0
    for i, a in enumerate(aim):
        if a is not None:
            below = ladder[a - 1] if a > 0 else 0
            left[i] = p.running(ladder[a] - step[i], ladder[a] - below, known[i].running_s)
            trained += ladder[a] - step[i]
    free = max(0, workers - sum(a is not None for a in aim))
    while True:
        while free > 0:  # each free worker asks the scheduler
            pick = _promotable(rung, aim, done, quality, ladder, eta)
            if pick is not None:
                i = pick
                aim[i] = rung[i] + 1
            elif started < n:
                i, started = started, started + 1
                quality.append(rng.random())
                step.append(0)
                rung.append(-1)
                aim.append(0)
                done.append(False)
                left.append(0.0)
            else:
                break
            units = ladder[aim[i]] - step[i]  # type: ignore[index]
            left[i], trained, free = p.unit(units), trained + units, free - 1
        running = [i for i, a in enumerate(aim) if a is not None]
        if not running:
            return trained, clock
        dt = min(left[j] for j in running)  # the next unit to end: the others run as long
        clock += dt
        for j in running:
            left[j] -= dt
        for j in running:
            if left[j] <= 1e-12 * max(1.0, clock):
                step[j] = ladder[aim[j]]  # type: ignore[index]
                rung[j], aim[j], free = aim[j], None, free + 1  # type: ignore[assignment]
                done[j] = rung[j] == last


def _promotable(rung: List[int], aim: List[Optional[int]], done: List[bool], quality: List[float],
                ladder: List[int], eta: int) -> Optional[int]:
    """The trial a free worker promotes (:meth:`hpctrain.search.asha.Asha.promotable`), or None."""
    for k in reversed(range(len(ladder) - 1)):
        members: List[Tuple[float, int]] = sorted((quality[i], i) for i in range(len(rung)) if rung[i] >= k
                                                  or (aim[i] is not None and aim[i] > k))  # type: ignore[operator]
        for _, i in members[: len(members) // eta]:
            if rung[i] == k and aim[i] is None and not done[i]:
                return i
    return None


def thin(strides: List[Stride], cap: int) -> List[Stride]:
    """At most ``cap`` strides: the older half merged pairwise (their seconds and steps summed) until they
    fit, so a long search's measurements stay few while any window over them keeps its totals."""
    out = sorted(strides, key=lambda s: s.end_s)
    while len(out) > max(2, cap):
        half = len(out) // 2
        old = [Stride(b.end_s, a.seconds + b.seconds, a.steps + b.steps) for a, b in zip(out[:half:2], out[1:half:2])]
        out = old + ([out[half - 1]] if half % 2 else []) + out[half:]
    return out


def units_of(records: Sequence[Tuple[float, str, Optional[int]]]) -> List[Span]:
    """A trial's units that ended, from its records in time order: ``(seconds, kind, step)`` with kind
    ``started`` or an end (``paused``, ``completed``, ``pruned``; its step: where the unit ended, None: not
    known, the unit left out). A unit that
    ended otherwise (failed, requeued, cancelled) is no measure of the pace: left out, as are the study's
    prunes of a paused trial (no start before them)."""
    out: List[Span] = []
    start: Optional[float] = None
    at = 0  # the step the trial is at: where its next unit starts
    for seconds, kind, step in records:
        if kind == "started":
            start = seconds
        elif kind in ("paused", "completed", "pruned"):
            end = at if step is None else int(step)
            if start is not None and end > at:
                out.append(Span(start, seconds, end - at))
            at, start = max(at, end), None
        else:
            start = None
    return out

