"""Who a sweep's local launcher is: its pid, start time and argv, recorded when it starts sending runs (the
argv as a hash: a secret override on the command line stays out of the sweep dir).

``cancel`` signals a recorded pid only when the process holding it now is that launcher (the same start
time and argv, asked of :mod:`hpctrain.core.liveness`, the one module that says what a process is): a pid
is reused once its process is gone, and the next holder (a notebook, another user's job) must not be killed.
No torch here.
"""

import hashlib
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

from hpctrain.core import liveness
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import HPCTRAIN_DIR

RECORD = "launcher.json"  # in <sweep>/.hpctrain


def record_path(sweep_dir: Union[str, Path]) -> Path:
    return Path(sweep_dir) / HPCTRAIN_DIR / RECORD


def identity(pid: int) -> Optional[Dict[str, Any]]:
    """``{"pid", "start", "argv_sha256"}`` of a live process, or None when there is none."""
    now = liveness.identity(pid)
    if now is None:
        return None
    argv = "\0".join(now.argv).encode("utf-8", "surrogateescape")
    return {"pid": int(pid), "start": now.start, "argv_sha256": hashlib.sha256(argv).hexdigest()}


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
    same = recorded.get("start") == now["start"] and recorded.get("argv_sha256") == now["argv_sha256"]
    return now["pid"] if same else None
