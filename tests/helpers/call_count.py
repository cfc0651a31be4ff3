"""Counting function calls: a measure of work that does not depend on the machine's load."""

import sys
from typing import Callable


def calls(fn: Callable[[], object]) -> int:
    """Python and C function calls made by ``fn()``."""
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]
