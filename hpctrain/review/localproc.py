"""Stopping the processes of a local sweep: its launcher and each run's submitit controller with its tasks.

A process started in the background (``&``, nohup) ignores SIGINT, and so do its children; submitit's
tasks ignore SIGTERM on purpose (Slurm sends it before SIGKILL). So: SIGINT where it is heard (the
controller then stops its tasks itself, as submitit's own ``cancel`` does), else the tasks are killed
and the controller, whose tasks are gone, ends on its own.
"""

import os
import signal
import time
from pathlib import Path
from typing import Dict, List

from hpctrain.review.jobs import pid_alive

GRACE_S = 5.0


def ignores(pid: int, sig: int) -> bool:
    """Whether ``pid`` ignores ``sig`` (the SigIgn mask of /proc/PID/status)."""
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def descendants(pid: int) -> List[int]:
    """Children, grandchildren, ... of ``pid`` (from /proc; empty where there is none)."""
    parents: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _kill_same(tree: Dict[int, bytes]) -> None:
    """SIGKILL the processes of ``tree`` still running the same command (a pid may have been reused)."""
    for pid, cmd in tree.items():
        if cmd and _cmdline(pid) == cmd:
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _wait_gone(pid: str, needle: str, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while pid_alive(pid, needle):
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_process(pid: str, needle: str) -> bool:
    """SIGINT if heard, else SIGTERM, then SIGKILL: True once the process is gone."""
    first = signal.SIGTERM if ignores(int(pid), signal.SIGINT) else signal.SIGINT
    for sig in (first, signal.SIGTERM, signal.SIGKILL):
        if not pid_alive(pid, needle):
            return True
        _signal(int(pid), sig)
        if _wait_gone(pid, needle, GRACE_S):
            return True
    return not pid_alive(pid, needle)


def stop_controller(pid: str) -> bool:
    """One local run: its submitit controller (``pid``) and every process under it."""
    if not pid_alive(pid, "submitit"):
        return True
    tree = {child: _cmdline(child) for child in descendants(int(pid))}
    if not ignores(int(pid), signal.SIGINT):
        _signal(int(pid), signal.SIGINT)  # the controller stops its tasks (SIGINT, then SIGKILL)
        if _wait_gone(pid, "submitit", GRACE_S):
            _kill_same(tree)  # strays, e.g. data loader workers of a task already gone
            return True
    _kill_same(tree)
    if _wait_gone(pid, "submitit", GRACE_S):  # its tasks gone, the controller ends by itself
        return True
    _signal(int(pid), signal.SIGKILL)
    return _wait_gone(pid, "submitit", GRACE_S)
