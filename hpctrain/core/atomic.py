"""Temp file + rename, and a lock beside a file: how hpctrain writes its own files.

Readers see the old file or the whole new one, never a part (as submitit's ``temporary_save_path``); a
write that fails leaves no temp file, and one that fails for want of space raises
:class:`~hpctrain.core.errors.DiskFullError` naming the file system.
A read-modify-write that two processes may do at once takes :func:`locked` first; its lock file is opened
without following a link (:mod:`hpctrain.core.safefs`). No torch here.
"""

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from hpctrain.core import safefs
from hpctrain.core.errors import disk_full

PathLike = Union[str, Path]

_UMASK = safefs.umask()


@contextmanager
def _temp_beside(path: Path, mode: Optional[int]) -> Iterator[Tuple[int, Path]]:
    """A new temp file beside ``path`` (``O_EXCL``: never a name someone else planted) and its descriptor,
    its mode set through the descriptor; renamed onto ``path`` when the block ends well, removed otherwise."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise disk_full(exc, path.parent) or exc
    try:
        os.fchmod(fd, 0o666 & ~_UMASK if mode is None else mode)  # mkstemp makes 0600; others may read
        yield fd, Path(tmp)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        full = disk_full(exc, path.parent)
        if full is not None and full is not exc:
            raise full from exc
        raise


@contextmanager
def replacing(path: PathLike, mode: Optional[int] = None) -> Iterator[Path]:
    """A temp path beside ``path``; renamed onto ``path`` when the block ends well, removed otherwise.
    For writers that need a file name of their own (``torch.save``). ``mode``: the file's, else the umask's
    (:func:`~hpctrain.core.safefs.exec_file_mode` for what a job executes or unpickles)."""
    with _temp_beside(Path(path), mode) as (_, tmp):
        yield tmp


def write_bytes_atomic(path: PathLike, data: bytes, mode: Optional[int] = None) -> None:
    with _temp_beside(Path(path), mode) as (fd, _):
        view = memoryview(data)
        while view:  # written through the descriptor mkstemp gave: never through a name swapped meanwhile
            view = view[os.write(fd, view):]


def write_text_atomic(path: PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str))


def read_json(path: PathLike) -> Optional[Dict[str, Any]]:
    """A JSON object, or None when the file is missing, unreadable or holds something else."""
    try:
        with open(os.open(path, os.O_RDONLY | safefs.NOFOLLOW)) as f:  # a planted link is no record
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def locked(lock_path: PathLike) -> Iterator[None]:
    """An exclusive ``flock`` on a sidecar file, held for the block (released by the kernel if the holder dies).

    The lock is on the sidecar, never on the data file: the data file is replaced by rename, and a lock
    on a replaced inode would lock nothing.
    """
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = safefs.open_lock(lock_path, 0o666 & ~_UMASK)  # never through a planted link
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
