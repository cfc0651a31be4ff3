"""Which failures a retry can fix: a node, a preemption, memory on a busy GPU, a lost connection; not a bug.

A run that fails the same way on every attempt (a config error, a shape that does not fit, a metric that
raises) is failed at once with its message instead of being retried ``max_retries`` times. The error is the
traceback tail the failed rank recorded; its last ``SomeError: message`` line decides.
"""

import re
from typing import Optional

# exceptions of the user's code or config: the same input raises them again
DETERMINISTIC = frozenset({
    "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "NameError", "ImportError",
    "ModuleNotFoundError", "AssertionError", "ZeroDivisionError", "NotImplementedError", "SyntaxError",
    "RecursionError", "UnboundLocalError", "LookupError",
    "omegaconf.errors.ConfigKeyError", "omegaconf.errors.ValidationError", "omegaconf.errors.InterpolationResolutionError",
    "ConfigKeyError", "ValidationError", "InterpolationResolutionError", "MissingMandatoryValue",
    "MetricError", "ModelOutputError",  # hpctrain's own: a metric or a model output that does not fit
    "hydra.errors.InstantiationException", "InstantiationException", "ConfigCompositionException",
})
# RuntimeErrors of shapes and sizes (torch raises RuntimeError for them): a bug, not the machine
_SHAPE = re.compile(r"shapes cannot be multiplied|size mismatch|must match the size|out of bounds|"
                    r"Error\(s\) in loading state_dict|expected scalar type|Expected .* but got|"
                    r"does not match the broadcast shape|not broadcastable", re.IGNORECASE)
# what the machine did: retried whatever the exception's class
_TRANSIENT = re.compile(r"out of memory|OutOfMemoryError|CUDA error|NCCL|ECC|Connection (reset|refused|closed)|"
                        r"Broken pipe|No space left|Socket timed out|node failure|killed|Timeout", re.IGNORECASE)
_LAST = re.compile(r"^(?:[\w.]+\.)?(?P<name>[A-Z]\w*(?:Error|Exception|Value))(?::|$)")


def deterministic(error: Optional[str]) -> bool:
    """Whether the recorded error would come back on every attempt (so a retry is wasted)."""
    if not error:
        return False  # died without a word: the machine's doing until shown otherwise
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
