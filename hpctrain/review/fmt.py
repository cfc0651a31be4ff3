"""Small text helpers shared by the review commands: a console that reads well piped, numbers, durations."""

import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

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
