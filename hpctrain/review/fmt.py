"""Small text helpers shared by the review commands: a console that reads well piped, numbers, durations."""

import math
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpctrain.core.state import State

STATE_STYLE: Mapping[State, str] = {
    State.QUEUED: "yellow",
    State.RUNNING: "cyan",
    State.REQUEUED: "magenta",
    State.HELD: "bold yellow",
    State.RETRYING: "magenta",
    State.COMPLETED: "green",
    State.PRUNED: "blue",
    State.PAUSED: "bright_blue",
    State.FAILED: "bold red",
    State.TIMEOUT: "red",
    State.HUNG: "bold magenta",
    State.CANCELLED: "dim",
}


def label(values: Dict[str, str], overrides: Sequence[str] = (), sep: str = " ") -> str:
    """A run as a person tells it apart: its swept values (``lr=0.01 seed=1``, numbers to 4 significant
    digits), else its overrides."""
    return sep.join(f"{k}={value(v)}" for k, v in values.items()) or sep.join(overrides) or "(defaults)"


def value(text: str) -> str:
    """A swept value as shown: a decimal number of more than 4 significant digits to 4 (``0.0028002728307563543``
    -> ``0.0028``); integers, short numbers as typed (``1e-3``) and text unchanged. Data files keep the full value."""
    mantissa = text.strip().lower().split("e")[0].lstrip("+-")
    if not ("." in text or "e" in text.lower()) or len(mantissa.replace(".", "").lstrip("0")) <= 4:
        return text
    try:
        number = float(text)
    except ValueError:
        return text
    return f"{number:.4g}" if math.isfinite(number) else text


def console(stream: Any = None) -> Any:
    """A rich console; piped, it is wide enough that no table row wraps (one run, one line), unless ``COLUMNS``
    says how wide (rich reads it, on a terminal too)."""
    from rich.console import Console

    stream = stream or sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    told = os.environ.get("COLUMNS", "").isdigit()
    return Console(file=stream, width=None if tty or told else PIPED_WIDTH, soft_wrap=not tty, highlight=False)


PIPED_WIDTH = 4000


def _fitted(con: Any) -> bool:
    """Whether tables fit the console's width: a terminal's, or the one ``COLUMNS`` gave a pipe."""
    return bool(con.is_terminal or con.width < PIPED_WIDTH)


def unicode_ok(con: Any) -> bool:
    return "utf" in (getattr(con, "encoding", "") or "").lower()


def runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def duration(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def bar(step: Optional[int], max_steps: Optional[int], width: int = 10, fancy: bool = True) -> str:
    """``1500/3000 █████░░░░░  50%``"""
    if step is None:
        return "-"
    step = int(step or 0)
    if not max_steps:
        return f"{step}/?"
    frac = max(0.0, min(1.0, step / max_steps))
    full = int(round(frac * width))
    fill, empty = ("█", "░") if fancy else ("#", ".")
    return f"{step}/{max_steps} {fill * full}{empty * (width - full)} {frac * 100:3.0f}%"


def short_path(path: Optional[str], here: Optional[str] = None) -> str:
    """Relative to the current directory (``here``, asked when not given: a table asks once, not per row)
    when under it (shorter to read and still copy-pasteable)."""
    if not path:
        return "-"
    here = here or os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def table(con: Any, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (),
          styles: Optional[Sequence[Sequence[Optional[str]]]] = None, row_styles: Optional[Sequence[Optional[str]]] = None,
          droppable: Sequence[int] = (), squeeze: Optional[int] = None) -> None:
    """Print aligned columns, one row per line, styled cells on a terminal.

    On a terminal narrower than the table, the ``droppable`` columns go first (in that order), then the
    ``squeeze`` column's cells are cut with "…", so that each row fits its width.

    rich's Table costs about 2 ms a row (2 s for a 1000-run sweep), so columns are padded here and the
    whole table goes out as one rich Text. On a terminal the last column (a path) is shortened from the
    left to keep each row on one line.
    """
    from rich.text import Span, Text

    if _fitted(con) and (droppable or squeeze is not None):
        headers, rows, styles, right, squeeze = _fit(con.width, headers, rows, styles, right, droppable, squeeze)
    widths = [max(map(len, column)) for column in zip(headers, *rows)]  # column by column, in C: 10,000 rows
    last = len(headers) - 1
    room = None
    if _fitted(con):
        room = max(20, con.width - sum(widths[:last]) - 2 * last)

    def cells(row: Sequence[str]) -> List[str]:
        out = []
        for i, cell in enumerate(row):
            if i == last and i in right:  # a number left last when the columns after it did not fit
                out.append(cell.rjust(widths[i]))
            elif i == last:
                out.append(cell if room is None or len(cell) <= room else "…" + cell[-(room - 1):])
            else:
                out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return out

    rule = ("─" if unicode_ok(con) else "-") * min(sum(widths) + 2 * last, con.width if _fitted(con) else 10**6)
    if not con.is_terminal or con.no_color:  # piped: plain lines, nothing for rich to do
        if room is None:  # nothing to cut: one format call a row
            template = "  ".join(f"{{:{'>' if i in right else '<'}{widths[i] if i < last or i in right else ''}}}"
                                 for i in range(len(headers)))
            lines = [template.format(*headers).rstrip(), rule] + [template.format(*row).rstrip() for row in rows]
        else:
            lines = ["  ".join(cells(headers)).rstrip(), rule] + ["  ".join(cells(row)).rstrip() for row in rows]
        con.file.write("\n".join(lines) + "\n")
        con.file.flush()
        return
    # a terminal: one Text with a span per styled cell (far cheaper than a Text.append per cell)
    parts: List[str] = []
    spans: List[Span] = []
    pos = 0

    def add(piece: str, style: Optional[str] = None) -> None:
        nonlocal pos
        if style:
            spans.append(Span(pos, pos + len(piece), style))
        parts.append(piece)
        pos += len(piece)

    add("  ".join(cells(headers)).rstrip() + "\n", "bold")
    add(rule + "\n", "dim")
    for n, row in enumerate(rows):
        row_style = row_styles[n] if row_styles else None
        for i, cell in enumerate(cells(row)):
            if i:
                add("  ")
            add(cell.rstrip() if i == last else cell, (styles[n][i] if styles else None) or row_style)
        add("\n")
    text = Text("".join(parts).rstrip("\n"), spans=spans, no_wrap=True, overflow="ignore")
    con.print(text, soft_wrap=True, crop=False)


def _fit(width: int, headers: Sequence[str], rows: Sequence[Sequence[str]],
         styles: Optional[Sequence[Sequence[Optional[str]]]], right: Sequence[int], droppable: Sequence[int],
         squeeze: Optional[int]) -> Any:
    """The columns that fit ``width``: ``droppable`` ones left out first, then ``squeeze``'s cells cut."""
    def needed(keep: List[int]) -> int:
        return sum(max([len(headers[i])] + [len(r[i]) for r in rows]) for i in keep) + 2 * (len(keep) - 1)

    keep = list(range(len(headers)))
    for i in droppable:
        if needed(keep) <= width:
            break
        keep.remove(i)
    over = needed(keep) - width
    cut: List[List[str]] = [list(r) for r in rows]
    if over > 0 and squeeze is not None and squeeze in keep:
        cap = max(len(headers[squeeze]), 8, max(len(r[squeeze]) for r in cut) - over) if cut else 8
        for r in cut:
            r[squeeze] = r[squeeze] if len(r[squeeze]) <= cap else r[squeeze][:cap - 1] + "…"
    new = {old: n for n, old in enumerate(keep)}
    return ([headers[i] for i in keep], [[r[i] for i in keep] for r in cut],
            [[s[i] for i in keep] for s in styles] if styles else styles, tuple(new[i] for i in right if i in new),
            new.get(squeeze) if squeeze is not None else None)
