"""A search space in the syntax of Hydra's Optuna sweeper: ``interval``, ``tag(log, ...)``, ``choice``, ``range``.

Parsed with Hydra's own override grammar, checked on the login node (one line per problem), and
turned into Optuna distributions only where a study is built. No optuna import at module level.
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

FLOAT, INT, CATEGORICAL = "float", "int", "categorical"


@dataclass(frozen=True)
class Param:
    """One searched key: a float or int range (``log`` scale, optional ``step``) or a list of choices."""

    key: str  # as written, with a leading ``+`` when the key is added to the config
    kind: str  # float | int | categorical
    text: str  # the override as the user wrote it, for messages
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        """The config key (Optuna's parameter name): without ``+``."""
        return self.key.lstrip("+~")

    @property
    def continuous(self) -> bool:
        return self.kind == FLOAT and self.step is None

    def grid(self) -> List[Any]:
        """Every value, for ``sampler=grid`` (only for choices and ranges: see :func:`check`)."""
        if self.kind == CATEGORICAL:
            return list(self.choices)
        assert self.low is not None and self.high is not None and self.step is not None
        n = int(round((self.high - self.low) / self.step)) + 1
        values = [self.low + i * self.step for i in range(n)]
        return [int(v) for v in values] if self.kind == INT else [round(v, 12) for v in values]

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == CATEGORICAL:
            return CategoricalDistribution(list(self.choices))
        assert self.low is not None and self.high is not None  # an interval or a range: bounds parsed
        if self.kind == INT:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)


@dataclass
class Space:
    params: List[Param]
    fixed: List[str]  # plain overrides every trial gets (``max_steps=50``, ``model=cnn``)

    def overrides(self, values: Dict[str, Any]) -> List[str]:
        """One trial's command-line overrides: the fixed ones, then ``key=value`` per searched key."""
        return list(self.fixed) + [f"{p.key}={_literal(values[p.name])}" for p in self.params]


def parse(arguments: Sequence[str], file_params: Optional[Dict[str, Any]] = None) -> Tuple[Space, List[str]]:
    """The space from ``hydra.sweeper.params`` (a sweep file) and the command line (which wins), and the
    problems found, one line each."""
    parser = OverridesParser.create()
    merged: Dict[str, str] = {}
    for key, value in (file_params or {}).items():
        merged[str(key)] = f"{key}={value}"
    problems: List[str] = []
    for arg in arguments:
        try:
            (o,) = parser.parse_overrides([arg])
        except Exception as exc:  # noqa: BLE001 - Hydra's parse errors, as one line
            problems.append(f"{arg}: {_one_line(exc)}")
            continue
        merged[o.key_or_group] = arg  # a command-line value replaces the file's
    params, fixed = [], []
    for text in merged.values():
        try:
            (o,) = parser.parse_overrides([text])
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{text}: {_one_line(exc)}")
            continue
        if not o.is_sweep_override():
            fixed.append(text)
            continue
        param, problem = _param(o, text)
        if problem:
            problems.append(problem)
        elif param is not None:
            params.append(param)
    return Space(params, fixed), problems


def _param(o: Override, text: str) -> Tuple[Optional[Param], Optional[str]]:
    key = o.get_key_element()
    v = o.value()
    tags = set(getattr(v, "tags", ()) or ())
    log = "log" in tags
    if getattr(v, "shuffle", False):
        return None, f"{text}: shuffle() has no meaning in a search"
    if isinstance(v, IntervalSweep):
        assert v.start is not None and v.end is not None  # Hydra's parser requires both
        low, high = float(v.start), float(v.end)
        kind = INT if "int" in tags else FLOAT
        param = Param(key, kind, text, low=low, high=high, log=log)
    elif isinstance(v, RangeSweep):
        start, stop, step = v.start, v.stop, v.step
        assert start is not None and stop is not None  # Hydra's parser requires both
        if not step or (stop - start) / step <= 0:
            return None, f"{text}: an empty range (expected start < stop with a positive step)"
        n = math.ceil((stop - start) / step - 1e-9)
        high = start + (n - 1) * step
        kind = INT if all(isinstance(x, int) for x in (start, stop, step)) else FLOAT
        param = Param(key, kind, text, low=start, high=high, log=log, step=None if log else step)
        if n == 1:
            param = Param(key, CATEGORICAL, text, choices=(start,))
    elif isinstance(v, ChoiceSweep):
        choices = tuple(v.list)
        if not choices:
            return None, f"{text}: an empty choice (expected at least one value)"
        if any(not isinstance(c, (int, float, str, bool, type(None))) for c in choices):
            return None, f"{text}: choices must be plain values (numbers, strings, booleans)"
        return Param(key, CATEGORICAL, text, choices=choices), None
    else:
        return None, f"{text}: {type(v).__name__} is not a search space (use interval, range or choice)"
    if param.kind != CATEGORICAL:
        if param.low is not None and param.high is not None and param.low > param.high:
            return None, f"{text}: a reversed interval (low {param.low:g} > high {param.high:g})"
        if param.low == param.high and param.kind == FLOAT and isinstance(v, IntervalSweep):
            return None, f"{text}: an empty interval (low = high = {param.low:g})"
        if log and (param.low is None or param.low <= 0):
            return None, f"{text}: a log scale needs bounds > 0 (low is {param.low:g})"
    return param, None


def check(space: Space, sampler: str) -> List[str]:
    """Problems of the space as a whole (given the sampler)."""
    problems = []
    if not space.params:
        problems.append("hydra.sweeper.params: nothing to search (give e.g. 'lr=tag(log,interval(1e-5,1e-1))')")
    if sampler == "grid":
        for p in space.params:
            if p.continuous:
                problems.append(f"{p.text}: sampler=grid needs a finite set of values; this interval is "
                                f"continuous (use choice(...) or range(...))")
    return problems


def grid_size(space: Space) -> int:
    n = 1
    for p in space.params:
        n *= len(p.grid())
    return n


def trial_dirname(number: int, values: Dict[str, Any], width: int = 3) -> str:
    """``trial-007_lr=0.00123,model.hidden=256``: a person can tell the trials apart by name."""
    parts = ",".join(f"{k}={_short(v)}" for k, v in values.items())
    name = f"trial-{number:0{width}d}" + (f"_{parts}" if parts else "")
    return name.replace("/", "_")[:200]


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _literal(value: Any) -> str:
    """A value as a Hydra override literal that parses back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if any(c in text for c in " ,()[]{}=:'\"\\") or text.lower() in ("true", "false", "null"):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def _one_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip() and not x.startswith("See https")]
    return " ".join(lines[1:] or lines)[:300]
