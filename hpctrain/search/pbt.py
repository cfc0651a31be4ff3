"""Population-based training's decisions (Jaderberg et al. 2017), pure: no torch, no optuna, no files.

A population of ``population`` trials trains in intervals of ``interval`` steps. At a boundary (the end
of an interval, step ``s``) a member's next interval is decided from every member's objective *at that
same boundary* (generations are synchronous: a member waits until the whole population reached ``s``),
so the decision does not depend on which worker asked first, and is the same when asked again:

- a member in the bottom ``quantile`` *exploits* a member of the top ``quantile`` (its checkpoint at ``s``
  is copied) and *explores*: each PBT parameter is resampled from its space with probability
  ``resample_p``, else perturbed (a continuous value times 0.8 or 1.2, clipped to its bounds; a choice
  moves to a neighbouring choice);
- any other member continues with its own parameters.

A member's objective that is missing or not finite ranks last. The random draws come from
``random.Random`` seeded by (study seed, member, step): a decision asked twice is the same decision.
"""

import math
import random
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from hpctrain.search.settings import SearchSweeperConf
from hpctrain.search.space import CATEGORICAL, Param, Space

PERTURB = (0.8, 1.2)
QUANTILE, RESAMPLE_P = SearchSweeperConf.quantile, SearchSweeperConf.resample_p  # the sweeper's defaults


@dataclass(frozen=True)
class Member:
    """One population member as the study sees it."""

    number: int
    params: Mapping[str, Any]  # the values of its current (or last) interval
    values: Mapping[int, float] = field(default_factory=dict)  # the objective at each boundary it reached
    step: int = 0  # the last boundary it reached (0: none yet)
    busy: bool = False  # a unit of it is under way

    def value_at(self, step: int) -> Optional[float]:
        v = self.values.get(step)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None


@dataclass(frozen=True)
class Decision:
    """A member's next interval: its parameters, and the donor whose checkpoint at ``step`` it copies."""

    number: int
    step: int  # the boundary it is decided at: the next interval starts here
    params: Dict[str, Any]
    copy_from: Optional[int] = None  # the donor's trial number (an exploit), None: continue


def check_params(space: Space, mutable: Optional[Collection[str]] = None) -> Optional[str]:
    """The first reason ``space`` cannot be searched by PBT, as one line, or None.

    Every searched key is a PBT parameter: it must be continuous (``interval``, ``tag(log, interval)``)
    or a ``choice``, and, when the app says which keys it can change mid-run (``mutable``; None: the app
    does not say), one of those."""
    for p in space.params:
        if not (p.continuous or p.kind == CATEGORICAL):
            return (f"{p.text}: scheduler=pbt perturbs continuous intervals and choices only "
                    f"(an integer or a range cannot be explored; use interval(...) or choice(...))")
        if mutable is not None and p.name not in mutable:
            return (f"{p.text}: scheduler=pbt cannot change {p.name!r} mid-run (the trainer applies "
                    f"{', '.join(sorted(mutable))} on resume; model shape, data, batch size are fixed for a run)")
    return None


def rng_for(seed: Optional[int], number: int, step: int) -> random.Random:
    """The draws of one decision: the same member at the same boundary draws the same numbers."""
    return random.Random(f"{seed}:{number}:{step}")


def ranked(members: Sequence[Member], step: int, minimize: bool) -> List[Member]:
    """Best first by the objective at ``step``; members without a finite value last (by number)."""
    finite = [m for m in members if m.value_at(step) is not None]
    finite.sort(key=lambda m: (m.value_at(step) if minimize else -m.value_at(step), m.number))  # type: ignore[operator]
    return finite + sorted((m for m in members if m.value_at(step) is None), key=lambda m: m.number)


def quantiles(members: Sequence[Member], step: int, quantile: float, minimize: bool
              ) -> Tuple[List[Member], List[Member]]:
    """(top, bottom) at ``step``: ``k = max(1, floor(n * quantile))`` each, never overlapping, the top
    only from members with a finite value; every member without one is in the bottom."""
    order = ranked(members, step, minimize)
    n = len(order)
    k = max(1, min(n // 2, int(math.floor(n * quantile + 1e-9))))
    top = [m for m in order[:k] if m.value_at(step) is not None]
    if not top:
        return [], []  # nothing to copy from
    bottom = order[n - k:] + [m for m in order[: n - k] if m.value_at(step) is None]
    return top, bottom


def explore(params: Mapping[str, Any], space: Space, resample_p: float, rng: random.Random) -> Dict[str, Any]:
    """New values from ``params``: each resampled with probability ``resample_p``, else perturbed."""
    out = dict(params)
    for p in space.params:
        if p.name not in out or rng.random() < resample_p:
            out[p.name] = sample(p, rng)
        else:
            out[p.name] = perturb(p, out[p.name], rng)
    return out


def sample(p: Param, rng: random.Random) -> Any:
    if p.kind == CATEGORICAL:
        return rng.choice(list(p.choices))
    assert p.low is not None and p.high is not None
    if p.log:
        return float(math.exp(rng.uniform(math.log(p.low), math.log(p.high))))
    return float(rng.uniform(p.low, p.high))


def perturb(p: Param, value: Any, rng: random.Random) -> Any:
    if p.kind == CATEGORICAL:
        choices = list(p.choices)
        i = choices.index(value) if value in choices else 0
        near = [j for j in (i - 1, i + 1) if 0 <= j < len(choices)]
        return choices[rng.choice(near)] if near else choices[i]
    assert p.low is not None and p.high is not None
    return float(min(p.high, max(p.low, float(value) * rng.choice(PERTURB))))


def decide(member: Member, population: Sequence[Member], space: Space, *, quantile: float = QUANTILE,
           resample_p: float = RESAMPLE_P, minimize: bool = True, seed: Optional[int] = None) -> Decision:
    """``member``'s next interval from the population's objectives at its boundary ``member.step``."""
    step = member.step
    top, bottom = quantiles(population, step, quantile, minimize)
    if member.number not in {m.number for m in bottom}:
        return Decision(member.number, step, dict(member.params))
    rng = rng_for(seed, member.number, step)
    donor = rng.choice(top)
    return Decision(member.number, step, explore(donor.params, space, resample_p, rng), copy_from=donor.number)


def ready(population: Sequence[Member], size: int, max_steps: int) -> Optional[Member]:
    """The member whose next interval can be decided now, or None: the whole population (``size``
    members) has reached this member's boundary, it is idle and not finished; the lowest boundary first."""
    if len(population) < size:
        return None
    low = min(m.step for m in population)
    for m in sorted(population, key=lambda m: (m.step, m.number)):
        if m.step == low and not m.busy and 0 < m.step < max_steps:
            return m
    return None


# ---------------------------------------------------------------- lineage and replay
def lineage_entry(step: int, parent: Optional[int], params: Mapping[str, Any]) -> Dict[str, Any]:
    """One entry of metrics.json's ``lineage``: from ``step`` on, ``params``; ``parent``: the trial whose
    checkpoint at ``step`` it took (None: its own)."""
    return {"step": int(step), "parent": parent, "params": dict(params)}


def schedule(number: int, lineages: Mapping[int, Sequence[Mapping[str, Any]]],
             until: Optional[int] = None) -> List[Dict[str, Any]]:
    """The hyperparameters trial ``number``'s weights were trained with, as ``[{"step", "params"}]``
    from step 0: its own entries back to its last exploit, before that its donor's (recursively).
    Consecutive entries with equal params are merged."""
    entries = [e for e in lineages.get(number, ()) if until is None or int(e["step"]) < until]
    out: List[Dict[str, Any]] = []
    start = 0
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].get("parent") is not None:
            out = schedule(int(entries[i]["parent"]), lineages, int(entries[i]["step"]))
            start = i
            break
    for e in entries[start:]:
        if not out or dict(out[-1]["params"]) != dict(e["params"]):
            out.append({"step": int(e["step"]), "params": dict(e["params"])})
    return out


def params_said(sched: Sequence[Mapping[str, Any]]) -> str:
    """A PBT trial's params as the launch summary and ``report`` both name them: the final ones (what its
    weights were trained with last), and, when its schedule changed them, the step they came in at and the
    values its weights started with."""
    if not sched:
        return ""
    final, first = sched[-1], sched[0]
    said = f"final params {_shown(final['params'])}"
    if len(sched) == 1:
        return said + " (its schedule never changed them)"
    return (f"{said} (from step {final['step']}; its weights started with {_shown(first['params'])}: "
            f"the schedule, {len(sched)} stretches, is in `hpctrain report`)")


def _shown(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))


def replay_overrides(sched: Sequence[Mapping[str, Any]]) -> List[str]:
    """Overrides that train one run with ``sched``: the first entry's values, and the trainer's ``schedule``
    key for every later change (``schedule=[{step:N,lr:...},...]``)."""
    if not sched:
        return []
    first = [f"{k}={_literal(v)}" for k, v in sched[0]["params"].items()]
    later = ["{" + ",".join([f"step:{int(e['step'])}"] + [f"{k}:{_literal(v)}" for k, v in e["params"].items()])
             + "}" for e in sched[1:]]
    return first + ([f"schedule=[{','.join(later)}]"] if later else [])


def _literal(value: Any) -> str:
    from hpctrain.search.space import _literal as literal

    return literal(value)


# ---------------------------------------------------------------- the scheduler (hpctrain.search.units)
class PBT:
    """``scheduler=pbt``: ``population`` NEW units to the first boundary, then each member's next interval
    as a CONTINUE unit once the whole population reached its boundary (``copy_from`` set on an exploit).
    Never more than ``population`` trials."""

    def __init__(self, space: Space, population: int, interval: int, max_steps: int, *,
                 quantile: float = QUANTILE, resample_p: float = RESAMPLE_P, seed: Optional[int] = None) -> None:
        self.space, self.population, self.interval, self.max_steps = space, int(population), int(interval), int(max_steps)
        self.quantile, self.resample_p, self.seed = float(quantile), float(resample_p), seed

    @classmethod
    def from_settings(cls, settings: Any) -> "PBT":
        """From the study's Settings (hpctrain.search.settings.Settings)."""
        interval = settings.interval or settings.eval_every
        return cls(settings.space, settings.population, int(interval), int(settings.max_steps),
                   quantile=settings.quantile, resample_p=settings.resample_p, seed=settings.seed)

    def end_of(self, start: int) -> int:
        return min(self.max_steps, start + self.interval)

    def members(self, view: Any) -> List[Member]:
        return [member_of(t, self.max_steps) for t in view.trials[: self.population]]

    def next_unit(self, view: Any) -> Any:
        from hpctrain.search.units import Next, Unit, UnitKind

        if view.next_number < min(self.population, view.n_trials):
            return Unit(None, UnitKind.NEW, 0, self.end_of(0), index=0)
        members = self.members(view)
        m = ready(members, len(members), self.max_steps)
        if m is None:
            return Next.DONE if all(x.step >= self.max_steps for x in members) else Next.IDLE
        d = decide(m, members, self.space, quantile=self.quantile, resample_p=self.resample_p,
                   minimize=_minimize(view), seed=self.seed)
        return Unit(m.number, UnitKind.CONTINUE, m.step, self.end_of(m.step), d.params, d.copy_from,
                    index=m.step // self.interval)

    def stranded(self, view: Any) -> List[int]:
        return []  # every member trains to max_steps


def member_of(t: Any, max_steps: int) -> Member:
    """A TrialView as a Member: a finished (or failed) trial stands at max_steps; a running one at its
    unit's start; a paused one at the end of the unit it paused after."""
    from hpctrain.core.state import State

    unit = t.unit
    params = dict(unit.params) if unit is not None and unit.params else dict(t.params)
    if t.state is State.PAUSED and unit is not None:
        step, busy = int(unit.end_step), False
    elif t.state is State.RUNNING:
        step, busy = (int(unit.start_step) if unit is not None else 0), True
    else:
        step, busy = max_steps, False  # completed, pruned or failed: it takes no more units
    return Member(t.number, params, dict(t.values), step, busy)


def _minimize(view: Any) -> bool:
    from hpctrain.core.state import Direction

    return Direction.parse(view.direction) is not Direction.MAX


def scheduler(settings: Any) -> PBT:
    """The study's scheduler for ``scheduler=pbt`` (hpctrain.search.study.build_scheduler)."""
    return PBT.from_settings(settings)
