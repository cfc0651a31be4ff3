"""Hydra's private names: the basic sweeper and the config loader's internals.

When a release moves one of these, this module is the one to change.
"""

from typing import Any, List

# Hydra: the basic sweeper's class (hpctrain's sweeper extends it; review expands a sweep with its
# split_arguments) and the config loader's internals used to plan 1000 points without composing each.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname  # noqa: F401
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: F401


def apply_overrides(overrides: List[Any], cfg: Any) -> None:
    """Hydra's own application of parsed value overrides to a config (type checks of structured configs)."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)
