"""Hydra's private names: the basic sweeper, the config loader's internals and JobReturn's stored value.

When a release moves one of these, this module is the one to change (canaries: tests/test_compat.py).
"""

from typing import Any, Callable, List, Optional

# Hydra: the basic sweeper's class (hpctrain's sweeper extends it; review expands a sweep with its
# split_arguments) and the config loader's internals used to plan 1000 points without composing each.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname  # noqa: F401
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: F401


def apply_overrides(overrides: List[Any], cfg: Any) -> None:
    """Hydra's own application of parsed value overrides to a config (type checks of structured configs)."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def group_checker(loader: Any) -> Callable[[str], bool]:
    """Whether a name is a config group of the loader's search path; always False for a loader that
    has no config repository (not Hydra's own)."""
    repo = getattr(loader, "repository", None)
    if repo is None:
        return lambda name: False
    return repo.group_exists


def search_path_of(loader: Any) -> Optional[Any]:
    """The loader's own ConfigSearchPath object (its elements may be edited on a copy), None if it has none."""
    return getattr(loader, "config_search_path", None)


def config_loader(search_path: Any) -> Any:
    """Hydra's config loader over a given ConfigSearchPath."""
    return ConfigLoaderImpl(config_search_path=search_path)


def stored_value(ret: Any) -> Any:
    """A JobReturn's value, or its exception when the job failed, without raising it
    (``JobReturn.return_value`` re-raises a failed job's exception)."""
    return ret._return_value
