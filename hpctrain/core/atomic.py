"""Temp file + rename, and a lock beside a file: how hpctrain writes its own files.

Readers see the old file or the whole new one, never a part (as submitit's ``temporary_save_path``); a
write that fails leaves no temp file, and one that fails for want of space raises
:class:`~hpctrain.core.errors.DiskFullError` naming the file system.
A read-modify-write that two processes may do at once takes :func:`locked` first. No torch here.
"""

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

from hpctrain.core.errors import disk_full

PathLike = Union[str, Path]

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def replacing(path: PathLike) -> Iterator[Path]:
    """A temp path beside ``path``; renamed onto ``path`` when the block ends well, removed otherwise.
    For writers that need a file name of their own (``torch.save``)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise disk_full(exc, path.parent) or exc
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; others on the shared storage may read
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        full = disk_full(exc, path.parent)
        if full is not None and full is not exc:
            raise full from exc
        raise


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def write_text_atomic(path: PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str))


def read_json(path: PathLike) -> Optional[Dict[str, Any]]:
    """A JSON object, or None when the file is missing, unreadable or holds something else."""
    try:
        with open(path) as f:
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
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666 & ~_UMASK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
