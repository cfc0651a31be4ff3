"""Which failures a retry can fix: a node, a preemption, memory on a busy GPU, a lost connection; not a bug.

A run that fails the same way on every attempt (a config error, a shape that does not fit, a metric that
raises) is failed at once with its message instead of being retried ``max_retries`` times. The error is the
traceback tail the failed rank recorded; its last ``SomeError: message`` line decides.
"""

import errno
import os
import re
from pathlib import Path
from typing import Optional, Union

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; a quota used up
# torch.save's zip writer after a short write (the file system full under it): "[enforce fail at
# inline_container.cc:672] . unexpected pos 761728 vs 761620", "PytorchStreamWriter failed writing file"
_TORCH_SHORT_WRITE = re.compile(r"inline_container\.cc|unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing|"
                                r"file write failed")
_FULL = re.compile(r"DiskFullError|\[Errno (28|122)\]|No space left on device|Disk quota exceeded")


class DiskFullError(OSError):
    """A write that failed for want of space, saying in one line which file system is full."""

    def __init__(self, path: Union[str, Path], cause: str = "") -> None:
        free = free_bytes(path)
        where = f" ({free} bytes free)" if free is not None else ""
        why = f"; {cause}" if cause else ""
        super().__init__(f"the file system of {path} is full{where}{why}: free space there (or raise the quota), "
                         f"then run the same command again: runs resume from their last complete checkpoint")
        self.path = str(path)  # (errno and filename unset: they would rewrite the message as "[Errno 28] ...")


def free_bytes(path: Union[str, Path]) -> Optional[int]:
    """Bytes free to this user on the file system of ``path`` (its nearest existing parent), None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(exc: BaseException, path: Union[str, Path]) -> Optional[DiskFullError]:
    """``exc`` as a DiskFullError naming ``path`` when it says the disk is full (ENOSPC, EDQUOT, torch.save's
    short write), else None."""
    if isinstance(exc, DiskFullError):
        return exc
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return DiskFullError(path, os.strerror(exc.errno))
    if isinstance(exc, RuntimeError) and _TORCH_SHORT_WRITE.search(str(exc)):
        return DiskFullError(path, f"torch.save: {str(exc).splitlines()[0] if str(exc) else 'short write'}")
    return None

# exceptions of the user's code or config: the same input raises them again
DETERMINISTIC = frozenset({
    "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "NameError", "ImportError",
    "ModuleNotFoundError", "AssertionError", "ZeroDivisionError", "NotImplementedError", "SyntaxError",
    "RecursionError", "UnboundLocalError", "LookupError",
    "omegaconf.errors.ConfigKeyError", "omegaconf.errors.ValidationError", "omegaconf.errors.InterpolationResolutionError",
    "ConfigKeyError", "ValidationError", "InterpolationResolutionError", "MissingMandatoryValue",
    "MetricError", "ModelOutputError",  # hpctrain's own: a metric or a model output that does not fit
    "NonFiniteLossError",  # the loss went to NaN/Inf: the same config diverges again
    "DiskFullError",  # a full disk stays full until someone frees it (docs/decisions.md)
    "hydra.errors.InstantiationException", "InstantiationException", "ConfigCompositionException",
    "OverrideParseException",  # an override line Hydra's grammar refuses: the same line again next time
})
# RuntimeErrors of shapes and sizes (torch raises RuntimeError for them): a bug, not the machine
_SHAPE = re.compile(r"shapes cannot be multiplied|size mismatch|must match the size|out of bounds|"
                    r"Error\(s\) in loading state_dict|expected scalar type|Expected .* but got|"
                    r"does not match the broadcast shape|not broadcastable", re.IGNORECASE)
# what the machine did: retried whatever the exception's class
_TRANSIENT = re.compile(r"out of memory|OutOfMemoryError|CUDA error|NCCL|ECC|Connection (reset|refused|closed)|"
                        r"Broken pipe|Socket timed out|node failure|killed|Timeout", re.IGNORECASE)
# a rank's /dev/shm is not its node's watchdog's (a container setting): the same next time, though its line names
# hang_timeout_s (which _TRANSIENT's "timeout" would take for the machine's)
_UNWATCHED = re.compile(r"\bUnwatchedError: ")
_LAST = re.compile(r"^(?:[\w.]+\.)?(?P<name>[A-Z]\w*(?:Error|Exception|Value))(?::|$)")


def deterministic(error: Optional[str]) -> bool:
    """Whether the recorded error would come back on every attempt (so a retry is wasted)."""
    if not error:
        return False  # died without a word: the machine's doing until shown otherwise
    if _FULL.search(error):
        return True  # a full disk: a retry seconds later finds it as full (docs/decisions.md)
    if _UNWATCHED.search(error):
        return True
    if _TRANSIENT.search(error):
        return False
    for line in reversed([ln.strip() for ln in error.splitlines() if ln.strip()]):
        m = _LAST.match(line)
        if m:
            return m.group("name") in DETERMINISTIC or (m.group("name") == "RuntimeError" and bool(_SHAPE.search(line)))
    return False


def last_line(error: Optional[str]) -> str:
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""
