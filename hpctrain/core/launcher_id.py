"""Who a sweep's local launcher is: its pid, start time and argv, recorded when it starts sending runs.

``cancel`` signals a recorded pid only when the process holding it now is that launcher (same start time
and argv in /proc): a pid is reused once its process is gone, and the next holder (a notebook, another
user's job) must not be killed. No torch here.
"""

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import HPCTRAIN_DIR

RECORD = "launcher.json"  # in <sweep>/.hpctrain


def record_path(sweep_dir: Union[str, Path]) -> Path:
    return Path(sweep_dir) / HPCTRAIN_DIR / RECORD


def identity(pid: int) -> Optional[Dict[str, Any]]:
    """``{"pid", "start", "argv"}`` of a live process (start: clock ticks after boot, /proc/PID/stat field
    22), or None when there is none (or no procfs)."""
    proc = Path("/proc") / str(pid)
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        argv = [a.decode("utf-8", "replace") for a in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return {"pid": int(pid), "start": int(fields[19]), "argv": argv}


def record(sweep_dir: Union[str, Path]) -> None:
    """This process as the sweep's launcher."""
    me = identity(os.getpid())
    if me is not None:
        write_json_atomic(record_path(sweep_dir), me)


def verified(sweep_dir: Union[str, Path], pid: Optional[int]) -> Optional[int]:
    """``pid`` where it is still the launcher the sweep recorded; None for a reused or unrecorded pid."""
    if not pid:
        return None
    recorded = read_json(record_path(sweep_dir)) or {}
    now = identity(int(pid))
    if now is None or recorded.get("pid") != now["pid"]:
        return None
    same_argv: List[str] = recorded.get("argv") or []
    return now["pid"] if recorded.get("start") == now["start"] and same_argv == now["argv"] else None
