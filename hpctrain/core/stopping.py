"""Stopping a local run's processes: its submitit controller (the run's job id is its pid) and its tasks.

A process started in the background (``&``, nohup) ignores SIGINT, and so do its children, as do the runs
of a local launcher (started so, so that a terminal's Ctrl-C reaches the launcher alone); submitit's tasks
ignore SIGTERM on purpose (Slurm sends it before SIGKILL). So: first the preemption signal to the tasks
(:func:`ask_to_checkpoint`: each checkpoints at its next step and, its record being final, exits), then
SIGINT where it is heard (the controller stops its tasks itself, as submitit's own ``cancel`` does), else
the tasks are killed and the controller, whose tasks are gone, ends on its own. No torch here.
"""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from hpctrain.core import liveness
from hpctrain.core.liveness import Liveness

GRACE_S = 5.0
CONTROLLER = "submitit.local._local"  # the command line of submitit's local controller
TASK = "submitit.core._submit"  # and of each task it starts


def alive(pid: str, needle: str) -> bool:
    """Not known gone: unknown counts as alive (:mod:`hpctrain.core.liveness`)."""
    return liveness.process(pid, needle=needle) is not Liveness.GONE


def ignores(pid: int, sig: int) -> bool:
    """Whether ``pid`` ignores ``sig`` (the SigIgn mask of /proc/PID/status)."""
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _children() -> Dict[int, List[int]]:
    parents: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    return parents


def descendants(pid: int) -> List[int]:
    """Children, grandchildren, ... of ``pid`` (from /proc; empty where there is none)."""
    parents = _children()
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tasks_of(pid: int) -> List[int]:
    """The tasks of the run whose job id is ``pid``: the controller's own children (``pid`` is the controller,
    or the shell that runs the launcher's setup lines before it); a data loader's workers are not tasks."""
    parents = _children()
    controllers = [pid] if CONTROLLER in _argv(pid) else [c for c in parents.get(pid, []) if CONTROLLER in _argv(c)]
    return [t for c in controllers for t in parents.get(c, []) if TASK in _argv(t)]


def _argv(pid: int) -> List[str]:
    """The arguments, each whole: a shell's ``-c`` line that names the module is not the module."""
    return _cmdline(pid).decode(errors="replace").split("\0")


def ask_to_checkpoint(pid: str, sig: int) -> int:
    """``sig`` (submitit's preemption signal) to each task of the run whose job id is ``pid``: hpctrain's trainer
    checkpoints at its next step and exits; how many tasks were asked."""
    tasks = tasks_of(int(pid)) if str(pid).isdigit() else []
    for task in tasks:
        _signal(task, sig)
    return len(tasks)


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


def wait_gone(pid: str, needle: str, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while alive(pid, needle):
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_process(pid: str, needle: str, first_wait_s: float = GRACE_S) -> bool:
    """SIGINT if heard, else SIGTERM (waited for ``first_wait_s``), then SIGTERM, then SIGKILL: True once the
    process is gone."""
    first = signal.SIGTERM if ignores(int(pid), signal.SIGINT) else signal.SIGINT
    for sig, wait_s in ((first, first_wait_s), (signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        if not alive(pid, needle):
            return True
        _signal(int(pid), sig)
        if wait_gone(pid, needle, wait_s):
            return True
    return not alive(pid, needle)


def end_child(proc: "Optional[subprocess.Popen[Any]]", grace_s: float = GRACE_S) -> None:
    """A child this process started: SIGTERM, then SIGKILL after ``grace_s``; reaped either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_controller(pid: str) -> bool:
    """One local run: its submitit controller (``pid``) and every process under it."""
    if not alive(pid, "submitit"):
        return True
    tree = {child: _cmdline(child) for child in descendants(int(pid))}
    if not ignores(int(pid), signal.SIGINT):
        _signal(int(pid), signal.SIGINT)  # the controller stops its tasks (SIGINT, then SIGKILL)
        if wait_gone(pid, "submitit", GRACE_S):
            _kill_same(tree)  # strays, e.g. data loader workers of a task already gone
            return True
    _kill_same(tree)
    if wait_gone(pid, "submitit", GRACE_S):  # its tasks gone, the controller ends by itself
        return True
    _signal(int(pid), signal.SIGKILL)
    return wait_gone(pid, "submitit", GRACE_S)


CHECKPOINT_GRACE_S = 30.0  # for the runs asked to checkpoint: a step and a save, then they are stopped


def end_runs(job_ids: Sequence[str], sig: int, grace_s: float = CHECKPOINT_GRACE_S,
             hurry: Callable[[], bool] = lambda: False) -> List[str]:
    """Each local run (its job id) asked to checkpoint (``sig`` to its tasks), waited for up to ``grace_s`` (no
    longer once ``hurry()`` says so), then whatever is left stopped; the job ids that did not stop."""
    asked = [j for j in job_ids if alive(j, "submitit")]
    for job_id in asked:
        ask_to_checkpoint(job_id, sig)
    deadline = time.time() + grace_s
    while time.time() < deadline and not hurry() and any(alive(j, "submitit") for j in asked):
        time.sleep(0.2)
    return [j for j in asked if not stop_controller(j)]
