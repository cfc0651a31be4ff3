"""A search's time left, from its trials' measured speed: the steps still to train divided by the steps per
second the search trained at over the last third of its time (all its trials together, their start-up and
pauses included).

The steps still to train: PBT and no scheduler: each trial to ``max_steps`` (a pruner stops some earlier:
the ETA is then an upper bound). ASHA and Hyperband (its brackets taken as the first): rung by rung, the
trials expected to reach it minus those that did, times the stretch below it, less what the trials running
to it have trained already. Every trial reaches the first rung; of the trials at a rung, the share that went
on to the next as measured so far, ``1/eta`` until ``eta`` trials got there or where fewer went on.

ASHA: the search played on from where it is, as :mod:`hpctrain.search.asha` decides, ``SAMPLES`` times
(seeded: the same state gives the same ETA), the mean of the steps it still trains. Async ASHA promotes more
than ``1/eta`` of a rung (11 of 27 on the README's example) and how many depends on the order the values
arrive, so no share measured early predicts it; the rule does, and once every trial started it ends the search
where the real one ends. A trial's quality is one draw for all its rungs (the rungs rank trials alike); the
trials there already get the best draws in the order of how far they went, those still to come fresh ones.

Pure: the caller reads the trials (the launcher's progress display). No torch, no Optuna.
"""

import random
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpctrain.search.asha import rungs

PROMOTING = ("asha", "hyperband")
SAMPLES = 48  # plays of the rest of an ASHA search: the mean's spread is a few % of it


@dataclass(frozen=True)
class Trial:
    step: int  # steps trained so far (0: not started)
    final: bool  # completed, pruned or failed: nothing more to train
    paused: bool = False  # at a rung (or PBT interval) it reached: its next stretch only if it is promoted


def steps_left(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any]) -> float:
    """The search's steps still to train: its trials in flight from where they are, the trials to come whole."""
    known = list(trials)
    n = max(int(n_trials or 0), len(known))
    max_steps = int(search.get("max_steps") or 0)
    if max_steps <= 0:
        return 0.0
    if search.get("scheduler") not in PROMOTING:
        return sum(max(0, max_steps - t.step) for t in known if not t.final) + (n - len(known)) * max_steps
    eta, first = int(search.get("eta") or 3), int(search.get("min_steps") or 0)
    ladder: List[int] = rungs(first, eta, max_steps) if 0 < first < max_steps and eta >= 2 else [max_steps]
    if search.get("scheduler") == "asha" and len(ladder) > 1:
        workers = max(1, min(int(search.get("workers") or 1), n))
        plays = random.Random(len(known) * 7919 + sum(t.step for t in known))
        return sum(_play(known, n, ladder, eta, workers, plays) for _ in range(SAMPLES)) / SAMPLES
    left, expected, below = 0.0, float(n), 0
    for k, rung in enumerate(ladder):
        reached = sum(t.step >= rung for t in known)
        heading = [t.step - below for t in known if not t.final and not t.paused and below <= t.step < rung]
        if k > 0:  # the share of the last rung's trials that went on: as measured once a few reached it
            at_last = sum(t.step >= below for t in known)
            share = (reached + len(heading)) / at_last if at_last >= eta else 0.0
            expected *= max(share, 1.0 / eta)
        expected = max(expected, float(reached + len(heading)))  # those heading there get there
        left += (expected - reached) * (rung - below) - sum(heading)
        below = rung
    return max(0.0, left)


def _play(known: List[Trial], n: int, ladder: List[int], eta: int, workers: int, rng: random.Random) -> float:
    """The steps one play of the rest of an ASHA search trains: its workers, each free one promoting the best
    paused trial in the top ``1 // eta`` of its rung (highest rung first), else starting a trial, else waiting."""
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
    left = [(ladder[a] - step[i]) if a is not None else 0 for i, a in enumerate(aim)]
    trained, started = 0.0, len(known)
    busy = sum(a is not None for a in aim)
    free = max(0, workers - busy)
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
                left.append(0)
            else:
                break
            left[i] = ladder[aim[i]] - step[i]  # type: ignore[index]
            free -= 1
        running = [i for i, a in enumerate(aim) if a is not None]
        if not running:
            return trained
        i = min(running, key=lambda j: left[j])  # the next to reach its rung: the others train as long
        dt = left[i]
        for j in running:
            left[j] -= dt
            step[j] += dt
            trained += dt
        for j in running:
            if left[j] <= 0:
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


def speed(samples: Sequence[Tuple[float, int]]) -> Optional[float]:
    """Steps per second over the last third of the time measured, from ``(seconds since the first trial
    started, steps trained by then)`` in time order: a shared machine's speed moves several-fold within a
    search (benchmarks/README.md), the last third follows it and still spans many trials. Over the whole time
    where no sample is that old or no step was trained since; None before any step."""
    if not samples:
        return None
    now, done = samples[-1]
    if now <= 0 or done <= 0:
        return None
    then, before = 0.0, 0
    for at, steps in samples:
        if at > now * 2 / 3:
            break
        then, before = at, steps
    if done > before and now > then:
        return (done - before) / (now - then)
    return done / now


def eta_s(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any],
          elapsed_s: float, earlier: Sequence[Tuple[float, int]] = ()) -> Optional[float]:
    """Seconds left: the steps still to train at the speed measured (:func:`speed` over ``earlier``, the
    samples taken before, and now: ``elapsed_s`` since the search's first trial started); None before any step
    was trained."""
    known = list(trials)
    rate = speed([*earlier, (elapsed_s, sum(t.step for t in known))])
    if rate is None or rate <= 0:
        return None
    return steps_left(known, n_trials, search) / rate
