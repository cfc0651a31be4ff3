"""Small text helpers shared by the review commands: a console that reads well piped, numbers, durations."""

import math
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

STATE_STYLE = {
    "pending": "yellow",
    "running": "cyan",
    "requeued": "magenta",
    "completed": "green",
    "failed": "bold red",
    "timeout": "red",
    "cancelled": "dim",
}


def console(stream: Any = None) -> Any:
    """A rich console; piped, it is wide enough that no table row wraps (one run, one line)."""
    from rich.console import Console

    stream = stream or sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(file=stream, width=None if tty else 4000, soft_wrap=not tty, highlight=False)


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


def short_path(path: Optional[str]) -> str:
    """Relative to the current directory when under it (shorter to read and still copy-pasteable)."""
    if not path:
        return "-"
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else str(Path(path))


def table(con: Any, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (),
          styles: Optional[Sequence[Sequence[Optional[str]]]] = None, row_styles: Optional[Sequence[Optional[str]]] = None
          ) -> None:
    """Print aligned columns, one row per line, styled cells on a terminal.

    rich's Table costs about 2 ms a row (2 s for a 1000-run sweep), so columns are padded here and the
    whole table goes out as one rich Text. On a terminal the last column (a path) is shortened from the
    left to keep each row on one line.
    """
    from rich.text import Text

    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    last = len(headers) - 1
    room = None
    if con.is_terminal:
        room = max(20, con.width - sum(widths[:last]) - 2 * last)

    def cells(row: Sequence[str]) -> List[str]:
        out = []
        for i, cell in enumerate(row):
            if i == last:
                out.append(cell if room is None or len(cell) <= room else "…" + cell[-(room - 1):])
            else:
                out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return out

    text = Text(no_wrap=True, overflow="ignore", end="")
    text.append("  ".join(cells(headers)).rstrip() + "\n", style="bold")
    rule = "─" if unicode_ok(con) else "-"
    text.append(rule * min(sum(widths) + 2 * last, con.width if con.is_terminal else 10**6) + "\n", style="dim")
    for n, row in enumerate(rows):
        row_style = row_styles[n] if row_styles else None
        for i, cell in enumerate(cells(row)):
            if i:
                text.append("  ")
            style = (styles[n][i] if styles else None) or row_style
            text.append(cell.rstrip() if i == last else cell, style=style)
        text.append("\n")
    text.rstrip()
    con.print(text, soft_wrap=True, crop=False)
