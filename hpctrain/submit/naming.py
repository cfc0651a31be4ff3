"""Run directory names from a point's parsed values: ``lr="1e-3"``, ``lr=1e-3`` and ``lr=0.001`` are one name.

Hydra's own ``override_dirname`` joins the override lines as typed, so a quoted value keeps its quotes in
the name and two spellings of one value name two directories. Here each value is written as it parsed:
numbers in Python's shortest form (``0.001``), booleans and null as Hydra writes them (``true``, ``null``),
a quoted string whose text is a number as that number, other strings unquoted. The key part (``+key``,
``key@pkg``) stays as typed. Sweeps made before this named their dirs by Hydra's rule: :func:`legacy`
gives that name, so that a rerun finds them.
"""

import re
from typing import Any, List, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser

_parser = None


def override_dirname(overrides: Sequence[Any], exclude_keys: Sequence[str], item_sep: str, kv_sep: str) -> str:
    """``hydra.job.override_dirname`` from parsed overrides, by value (see the module's docstring)."""
    return _join([line(o) for o in overrides if o.key_or_group not in exclude_keys], item_sep, kv_sep)


def legacy(overrides: Sequence[Any], exclude_keys: Sequence[str], item_sep: str, kv_sep: str) -> str:
    """Hydra's own ``override_dirname`` (the lines as typed): the names of sweeps made before."""
    return _join([o.input_line for o in overrides if o.key_or_group not in exclude_keys], item_sep, kv_sep)


def _join(lines: List[str], item_sep: str, kv_sep: str) -> str:
    return re.sub("[=]", kv_sep, item_sep.join(sorted(lines)))  # as Hydra's get_overrides_dirname


def line(o: Any) -> str:
    """``key=value`` with the value written as it parsed; a deletion or a sweep stays as typed."""
    typed = o.input_line
    if typed is None or "=" not in typed or o.is_sweep_override():
        return typed
    return f"{typed.split('=', 1)[0]}={value_text(o)}"


def value_text(o: Any) -> str:
    value = o.value()
    if isinstance(value, str) and "${" not in value:
        if o.get_value_element_as_str().startswith(("'", '"')):
            as_typed = _unquoted(value)  # "1e-3" is the number 1e-3 once the config's float type converts it
            if as_typed is not None:
                return as_typed
        return value
    return _scalar(value) or o.get_value_element_as_str()


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    return ""


def _unquoted(text: str) -> "str | None":
    """The number, boolean or null that ``text`` spells unquoted, written as such; None for other text."""
    global _parser
    if _parser is None:
        _parser = OverridesParser.create()
    try:
        value = _parser.parse_override(f"k={text}").value()
    except Exception:  # noqa: BLE001 - text that is no value unquoted stays text
        return None
    return _scalar(value) if value is None or isinstance(value, (bool, int, float)) else None
