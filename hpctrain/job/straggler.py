"""Stragglers: a rank whose own work per step is persistently slower than the other ranks' of its job.

What is measured. In a DDP step every rank waits for the slowest one in the gradient all-reduce, so the
step time is the same on every rank and says nothing. Each rank therefore times its own work: from the end
of one step's synchronising backward (the all-reduce) to the start of the next one's, i.e. the optimizer
step, the wait for data, the forward and the accumulation micro-steps' backward; two ``perf_counter`` reads
a step on the host. At each log step the interval's mean per step rides along in the all-reduce the trainer
makes there anyway for the loss (one slot per rank), so every rank knows every rank's figure without an
extra collective; rank 0 judges them (:class:`Detector`) and records what it finds. On a GPU, whose host
runs ahead of it, the host's clock would time kernel launches: there the trainer times the last step of
each window on the device (two CUDA events, read after the log step's sync, sent a window later).

Persistently: a rank whose figure is at least ``straggler_factor`` (default 1.3) times the median of the
other ranks' figures, and at least :data:`MIN_EXCESS_S` more per step (timer noise of sub-millisecond steps
is not a straggler), in ``straggler_windows`` (default 3) log windows in a row. The first window of each
attempt is left out (a compile, a warm-up). ``straggler_factor=0`` turns it off.

Flagged once per rank and attempt: a ``straggler`` event in the run record (rank, node, factor, step) and
the summary's ``stragglers`` (its latest factor while it lasts), which ``status``, the tab, ``report`` and
``hpctrain.load`` read. No torch here.
"""

from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

FACTOR = 1.3  # straggler_factor's default: own time per step / the other ranks' median
WINDOWS = 3  # straggler_windows' default: log windows in a row
MIN_EXCESS_S = 0.005  # and this much slower per step at least
SKIP_WINDOWS = 1  # the attempt's first log windows, left out (a compile, the first batches)


@dataclass(frozen=True)
class Straggler:
    """One flagged rank as the summary and the record hold it."""

    rank: int
    node: str
    factor: float  # its own work per step / the median of the other ranks'
    step: int  # the log step it was last judged at
    since: int  # the first step of its slow windows
    own_s: float  # its own work per step
    others_s: float  # the other ranks' median

    def line(self) -> str:
        return f"straggler: rank {self.rank} on {self.node or 'an unknown node'}, {self.factor:.1f}x"

    def to_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "factor": round(self.factor, 2), "own_s": round(self.own_s, 6),
                "others_s": round(self.others_s, 6)}


class Detector:
    """Rank 0's judge of the ranks' figures, one call per log window (pure: no clock; ``node_of`` is asked
    for a rank's node when it is flagged)."""

    def __init__(self, factor: float = FACTOR, windows: int = WINDOWS, min_excess_s: float = MIN_EXCESS_S,
                 skip: int = SKIP_WINDOWS, node_of: Callable[[int], str] = lambda rank: "") -> None:
        self.factor, self.windows, self.min_excess_s, self.skip = factor, max(1, windows), min_excess_s, skip
        self.node_of = node_of
        self.seen = 0  # windows judged
        self.slow: Dict[int, List[int]] = {}  # rank -> the log steps of its current run of slow windows
        self.flagged: Dict[int, Straggler] = {}

    def window(self, step: int, own: Sequence[float]) -> List[Straggler]:
        """Judge one window's figures (``own[r]``: rank r's work per step); the ranks flagged by now, with
        this window's factor where they are still slow."""
        self.seen += 1
        if self.seen <= self.skip or len(own) < 2:
            return list(self.flagged.values())
        order = sorted(range(len(own)), key=own.__getitem__)
        ranked = [own[r] for r in order]
        for place, rank in enumerate(order):
            mine, others = own[rank], median_without(ranked, place)
            if not (others > 0 and mine >= self.factor * others and mine - others >= self.min_excess_s):
                self.slow.pop(rank, None)
                continue
            run = self.slow.setdefault(rank, [])
            run.append(step)
            if len(run) >= self.windows:
                before = self.flagged.get(rank)
                node = before.node if before else self.node_of(rank)
                self.flagged[rank] = Straggler(rank, node, mine / others, step, before.since if before else run[0],
                                               mine, others)
        return list(self.flagged.values())


def median_without(ranked: Sequence[float], place: int) -> float:
    """The median of sorted ``ranked`` without its element at ``place`` (the other ranks'): O(1)."""
    n = len(ranked) - 1

    def at(i: int) -> float:
        return ranked[i] if i < place else ranked[i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def detector_of(config: Any, node_of: Callable[[int], str]) -> Optional[Detector]:
    """A Detector from a run's config (``straggler_factor``, ``straggler_windows``; keys absent in a user's
    own app: the defaults); None when ``straggler_factor=0`` turns it off."""
    get = config.get if hasattr(config, "get") else (lambda key, default=None: default)
    factor = get("straggler_factor", FACTOR)
    factor = FACTOR if factor is None else float(factor)
    if factor <= 0:
        return None
    windows = get("straggler_windows", WINDOWS)
    return Detector(factor, WINDOWS if windows is None else int(windows), node_of=node_of)
