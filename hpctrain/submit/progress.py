"""A blocking sweep's progress, read from the runs' own records and metrics.json (never their stdout).

On a terminal: a block redrawn in place (runs done / running / failed, each running run's step, an
ETA), with a permanent line above it for each run that ends. Piped: one line per event (a run starts,
is retried, ends), nothing redrawn. Then the closing summary: one short line per run.
"""

import math
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from hydra.core.utils import filter_overrides

from hpctrain.core import events, manifest, summary
from hpctrain.core.redact import redact_overrides
from hpctrain.core.state import FAILURES, FINAL, EventKind, State

MAX_SHOWN = 20  # running runs drawn in the block; more are counted on one line
QUIET = (State.QUEUED, State.HELD)  # waiting is not an event
STRIDES = 4096  # a search's pace measurements kept (the older merged): a read a second per running trial


# a search's trials as the sweep lists them: their specs, their labels (params) by idx, how many to come, and
# the search's settings (sweep.json's "search": scheduler, rungs, max_steps) for its ETA
Found = Tuple[Sequence[Any], Dict[int, str], Optional[int], Optional[Dict[str, Any]]]


@dataclass
class LastRead:
    """What the display last read of one run."""

    state: Optional[State] = None
    step: Optional[int] = None
    max_steps: Optional[int] = None
    error: Optional[str] = None
    job_id: Optional[str] = None
    objective: str = ""  # ``val/loss=0.4132``, once the run has a value of it


def swept_labels(overrides: Sequence[Sequence[str]]) -> List[str]:
    """Each run's swept values, ``lr=0.001 seed=1`` (keys set alike in every run left out; with one run,
    all of its overrides), secrets redacted; ``(defaults)`` for a run without any."""
    parsed = [redact_overrides(filter_overrides(list(ov))) for ov in overrides]
    values: Dict[str, set] = {}
    for p in parsed:
        for o in p:
            values.setdefault(_key(o), set()).add(o)
    same = {k for k, v in values.items() if len(v) == 1 and all(any(_key(o) == k for o in p) for p in parsed)}
    if len(parsed) < 2:
        same = set()
    return [" ".join(o for o in p if _key(o) not in same) or "(defaults)" for p in parsed]


def objective_text(metrics_json: Dict[str, Any]) -> str:
    """``val/loss=0.4132``: the run's objective (else the first metric a foreign app returned); "" without."""
    metrics = metrics_json.get("metrics") or {}
    told: Dict[str, Any] = metrics_json["objective"] if isinstance(metrics_json.get("objective"), dict) else {}
    if isinstance(told.get("value"), (int, float)) and not isinstance(told.get("value"), bool):
        return f"{told.get('metric') or 'value'}={told['value']:.4g}"  # what a search's worker told the study
    name = told.get("metric") if told.get("metric") in metrics else next(iter(metrics), None)
    value = metrics.get(name) if name else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return f"{name}={value:.4g}"


def trials_of(sweep_dir: Any) -> Found:
    """A search's trials from sweep.json: each labelled by its parameters (``lr=0.01398``), and n_trials."""
    found = manifest.read(sweep_dir)
    if found is None:
        return [], {}, None, None
    labels = {idx: " ".join(f"{k}={_short(v)}" for k, v in (entry.extra.get("params") or {}).items())
              for idx, entry in found.runs.items()}
    total = (found.search or {}).get("n_trials")
    return ([e.spec for e in found.runs.values()], labels, total if isinstance(total, int) else None,
            dict(found.search) if found.search else None)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def duration(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """The display of one blocking sweep. ``runs``: objects with ``idx``, ``run_dir``, ``overrides`` and
    ``max_steps`` (the planned runs); ``alive(idx)``: the run's job has not ended yet, so a failure it
    recorded may still be retried (it shows running until the job ends)."""

    def __init__(self, runs: Sequence[Any], stream: Optional[TextIO] = None, interval_s: float = 1.0,
                 alive: Callable[[int], bool] = lambda idx: False, clock: Callable[[], float] = time.monotonic,
                 discover: Optional[Callable[[], Found]] = None, wall: Callable[[], float] = time.time) -> None:
        self.runs = list(runs)
        self.labels = dict(zip((r.idx for r in self.runs), swept_labels([r.overrides for r in self.runs])))
        self.discover = discover
        self.total: Optional[int] = None  # the runs to come where they are discovered (a search's n_trials)
        self.search: Optional[Dict[str, Any]] = None  # a search's settings: its ETA from the trials' speed
        self.wall = wall  # the records' clock (epoch seconds): a running unit's time so far
        self.spans: Dict[int, List[Any]] = {}  # a search's trials' units that ended (eta.Span), by idx
        self.strides: List[Any] = []  # steps trained inside running units between two progress writes (eta.Stride)
        self.unit_start: Dict[int, float] = {}  # a running trial's unit: when its start was recorded
        self._counted: Dict[int, int] = {}  # records of a run measured so far
        self._wrote: Dict[int, Tuple[float, float, int]] = {}  # its last progress write: (unit start, time, step)
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval_s = max(interval_s, len(self.runs) / 1000)  # ~0.25 ms a record: 10,000 read every 10 s
        self.alive = alive
        self.clock = clock
        self.started = clock()
        self.last_read = -math.inf
        self.seen: Dict[int, LastRead] = {r.idx: LastRead(max_steps=r.max_steps) for r in self.runs}
        self.drawn = 0  # lines of the block now on the terminal
        self.shown: List[str] = []  # and what they say
        if discover is not None:  # what is there already (a study resumed) is the baseline, not an event
            self._discover()
            for run in self.runs:
                self.seen[run.idx] = self._read(run)

    def _discover(self) -> None:
        """Add the runs that appeared since the last read (a search's trials, as its workers start them)."""
        assert self.discover is not None
        specs, labels, self.total, self.search = self.discover()
        for spec in specs:
            if spec.idx not in self.seen:
                self.runs.append(spec)
                self.seen[spec.idx] = LastRead(max_steps=spec.max_steps)
            self.labels[spec.idx] = labels.get(spec.idx) or self.labels.get(spec.idx) or spec.name

    # ------------------------------------------------------------------ reading
    def _read(self, run: Any) -> LastRead:
        old = self.seen[run.idx]
        if old.state in FINAL:
            return old  # a final state never changes: not read again
        rs = events.read(run.run_dir)
        found = summary.read(run.run_dir) or {}
        state = rs.state if rs.state is not None else State.parse(found.get("status"))
        if state in FAILURES and self.alive(run.idx):
            state = State.RUNNING  # the attempt is ending: its retry is decided once its job has ended
        step = found.get("step") if isinstance(found.get("step"), int) else old.step
        steps = found.get("max_steps") if isinstance(found.get("max_steps"), int) else old.max_steps
        if self.search is not None:
            self._measure(run.idx, rs, found, state, step)
        job_id = old.job_id
        if state is not old.state and rs.last_start is not None:  # a retry's start may be another job
            job_id = rs.job_id or job_id
        return LastRead(state, step, steps, rs.error or found.get("error"), job_id, objective_text(found))

    def _measure(self, idx: int, rs: Any, found: Dict[str, Any], state: Optional[State], step: Optional[int]) -> None:
        """A search trial's pace: its units that ended (from its records' times) and the steps its running
        unit trained between two of its progress writes (metrics.json's ``updated`` and ``step``)."""
        from hpctrain.search import eta

        if len(rs.events) != self._counted.get(idx):
            self._counted[idx] = len(rs.events)
            records = []
            for e in rs.events:
                at = None
                if e.kind in (EventKind.PAUSED, EventKind.PRUNED):
                    at = e.data().get("step")
                elif e.kind is EventKind.COMPLETED:
                    at = step if step is not None else (self.search or {}).get("max_steps")
                records.append((e.time_ns / 1e9, e.kind.value, at if isinstance(at, int) else None))
            self.spans[idx] = eta.units_of(records)
        running = state in (State.RUNNING, State.REQUEUED) and rs.last_start is not None
        if not running:
            self.unit_start.pop(idx, None)
            return
        start = rs.last_start.time_ns / 1e9
        self.unit_start[idx] = start
        wrote = found.get("updated")
        if not isinstance(wrote, (int, float)) or not isinstance(step, int) or wrote < start:
            return  # no write of this unit yet (the one there is its last unit's)
        last = self._wrote.get(idx)
        if last is not None and last[0] == start and step > last[2] and wrote > last[1]:
            self.strides.append(eta.Stride(wrote, wrote - last[1], step - last[2]))
            if len(self.strides) > 2 * STRIDES:
                self.strides = eta.thin(self.strides, STRIDES)
        if last is None or last[0] != start or step > last[2]:
            self._wrote[idx] = (start, float(wrote), step)

    def counts(self) -> Dict[str, int]:
        states = [s.state for s in self.seen.values()]
        return {"done": sum(s in FINAL for s in states),
                "running": sum(s in (State.RUNNING, State.REQUEUED) for s in states),
                "failed": sum(s in FAILURES for s in states)}

    def eta_s(self) -> Optional[float]:
        """Time left: a search's from its trials' measured speed (:mod:`hpctrain.search.eta`); a grid's from
        the share of the work done so far (steps where the runs have a budget)."""
        if self.search is not None:
            return self._search_eta(self.search)
        share = 0.0
        for s in self.seen.values():
            if s.state in FINAL:
                share += 1
            elif s.state in (State.RUNNING, State.REQUEUED) and s.step and s.max_steps:
                share += min(1.0, s.step / s.max_steps)
        share /= max(1, self.total or 0, len(self.seen))
        elapsed = self.clock() - self.started
        if share <= 0 or share >= 1 or elapsed <= 0:
            return None
        return elapsed * (1 - share) / share

    def _search_eta(self, search: Dict[str, Any]) -> Optional[float]:
        from hpctrain.search import eta

        now = self.wall()
        trials = [eta.Trial(s.step or 0, s.state in FINAL, s.state is State.PAUSED,
                            max(0.0, now - self.unit_start[idx]) if idx in self.unit_start else 0.0)
                  for idx, s in self.seen.items()]
        measured = eta.pace([u for units in self.spans.values() for u in units], self.strides,
                            first_units=int(search.get("workers") or 1))  # each worker's first unit: its imports
        return eta.eta_s(trials, self.total, search, measured)

    # ------------------------------------------------------------------ lines
    def counts_text(self) -> str:
        c = self.counts()
        total = max(self.total or 0, len(self.runs))
        eta = self.eta_s() if c["done"] < total else None  # all done: nothing left to estimate
        return (f"{c['done']}/{total} done, {c['running']} running, {c['failed']} failed"
                + (f", ETA {duration(math.ceil(eta))}" if eta is not None else ""))  # a countdown: 0 s means done

    def event_line(self, idx: int, s: LastRead, counts: Optional[str] = None) -> str:
        what = {State.RUNNING: "started", State.RETRYING: "retrying", State.REQUEUED: "requeued"}.get(s.state) if s.state else None
        what = what or str(s.state)
        detail = ""
        if s.state is State.RUNNING and s.job_id:
            detail = f" (job {s.job_id})"
        elif s.state in (State.COMPLETED, State.PRUNED) and s.objective:
            detail = f" {s.objective}"
        elif s.state in FAILURES and s.error:
            last = [line.strip() for line in s.error.splitlines() if line.strip()]
            detail = f": {last[-1][:120]}" if last else ""
        return f"  {what:<9} #{idx} {self.labels[idx]}{detail}   [{counts or self.counts_text()}]"

    def block(self) -> List[str]:
        running = [(r.idx, self.seen[r.idx]) for r in self.runs
                   if self.seen[r.idx].state in (State.RUNNING, State.REQUEUED)]
        lines = [f"hpctrain: {self.counts_text()}"]
        for idx, s in running[:MAX_SHOWN]:
            if s.step is None:
                where = "starting"
            elif s.max_steps:
                where = f"step {s.step}/{s.max_steps} {100 * s.step / s.max_steps:3.0f}%"
            else:
                where = f"step {s.step}"
            lines.append(f"  #{idx} {self.labels[idx]}  {where}")
        if len(running) > MAX_SHOWN:
            lines.append(f"  ... and {len(running) - MAX_SHOWN} more running")
        return lines

    # ------------------------------------------------------------------ output
    def update(self, force: bool = False) -> None:
        """Read the records (at most every ``interval_s`` unless ``force``), then print what changed."""
        now = self.clock()
        if not force and now - self.last_read < self.interval_s:
            return
        self.last_read = now
        if self.discover is not None:
            self._discover()
        changed: List[int] = []
        for run in self.runs:
            new = self._read(run)
            if new.state is not self.seen[run.idx].state and new.state not in QUIET:
                changed.append(run.idx)
            self.seen[run.idx] = new
        counts = self.counts_text() if changed else ""  # once per read: the same for every line of it
        if not self.tty:
            self.stream.write("".join(self.event_line(idx, self.seen[idx], counts) + "\n" for idx in changed))
            self.stream.flush()
            return
        # a terminal: ended runs (and retries) stay as lines above the block; starts show in the block
        kept = [self.event_line(idx, self.seen[idx], counts) for idx in changed
                if self.seen[idx].state is not State.RUNNING]
        self._redraw(kept, self.block())

    def clear(self) -> None:
        """The block taken away, nothing read (the launcher was interrupted: its one line follows)."""
        if self.tty:
            self._redraw([], [])

    def close(self) -> None:
        """The last read; on a terminal the block is taken away (the closing summary follows)."""
        self.update(force=True)
        if self.tty:
            self._redraw([], [])

    def _redraw(self, kept: List[str], block: List[str]) -> None:
        if not kept and block == self.shown and block:
            return  # nothing new: no flicker
        self.shown = block
        width = shutil.get_terminal_size((100, 24)).columns
        out = f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""  # back to the block's first line, cleared
        out += "".join(line + "\n" for line in kept)
        out += "".join(_cut(line, width) + "\n" for line in block)
        self.drawn = len(block)
        self.stream.write(out)
        self.stream.flush()


def _cut(line: str, width: int) -> str:
    """A line that never wraps: a wrapped one would break the count of lines to redraw."""
    return line if len(line) < width else line[:max(1, width - 2)] + "…"
