"""OmegaConf's private names: the interpolation parser, memoized while a sweep is planned.

When a release moves one of these, this module is the one to change (canaries: tests/test_compat.py).
"""

import contextlib
import functools
from typing import Iterator


# OmegaConf
@contextlib.contextmanager
def interpolation_parser_memoized() -> Iterator[None]:
    """OmegaConf's interpolation parser memoized per string, for the duration of the block.

    ``omegaconf.base.parse`` builds an ANTLR parse tree for every interpolation it resolves (2 ms each);
    the trees are only read (visited) afterwards, so one tree per distinct string serves every use.
    """
    import omegaconf.base as ombase

    original = ombase.parse
    ombase.parse = functools.lru_cache(maxsize=4096)(original)
    try:
        yield
    finally:
        ombase.parse = original


def node_flag(node: object, name: str) -> "bool | None":
    """A node's own flag (``readonly``, ``struct``): True, False, or None when it inherits its parent's."""
    return node._get_node_flag(name)  # type: ignore[attr-defined]
