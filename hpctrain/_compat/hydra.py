"""Hydra's private names: the basic sweeper, the config loader's internals and JobReturn's stored value.

When a release moves one of these, this module is the one to change (canaries: tests/test_compat.py).
"""

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

# Hydra: the basic sweeper's class (hpctrain's sweeper extends it; review expands a sweep with its
# split_arguments) and the config loader's internals used to plan 1000 points without composing each.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname  # noqa: F401

if TYPE_CHECKING:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: F401


def __getattr__(name: str) -> Any:
    """``BasicSweeper``, imported once Hydra's plugin scan has run: the scan loads the module again, and a
    sweeper subclassing the class of an earlier import fails Hydra's ``super(BasicSweeper, self)``."""
    if name == "BasicSweeper":
        from hydra.core.plugins import Plugins

        Plugins.instance()  # the scan (once per process)
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        return BasicSweeper
    raise AttributeError(name)


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


def hydra_args(argv: List[str]) -> Optional[Any]:
    """Hydra's own reading of a command line (its flags and overrides, these read wherever they stand among
    the flags), None where its parser refuses it."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text: Hydra prints it again itself
            args, rest = get_args_parser().parse_known_intermixed_args(argv)
    except (SystemExit, TypeError):
        return None
    return None if rest else args


def app_config_loader(config_path: str, config_dir: Optional[str]) -> Any:
    """The config loader Hydra's ``@hydra.main(config_path=...)`` builds, ``--config-dir`` included."""
    import os

    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_automatic_config_search_path(None, None, config_path)
    if config_dir is not None:
        search_path.prepend(provider="command-line", path=f"file://{os.path.abspath(config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    return config_loader(search_path)


_MODE_LINE = "hydra.mode=MULTIRUN"  # what Hydra's _run_app appends for -m when the config sets no hydra.mode


@contextlib.contextmanager
def mode_composed_once() -> Iterator[None]:
    """Hydra's ``-m`` composes the same config twice: once unvalidated for ``get_mode`` (which reads only
    ``hydra.mode`` and drops it), then for ``multirun``, with ``hydra.mode=MULTIRUN`` appended where the
    config sets no mode. Within this, the second call gets the first's config, after the sweep-override check
    the first skipped and with that one appended override applied as Hydra applies it (a value, set last;
    its line last in ``hydra.overrides.hydra``). Each config is handed on at most once, so no caller sees
    another's edits; anything else, or a failure, is composed (and reported) by Hydra itself."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    original = ConfigLoaderImpl.load_configuration
    kept: Dict[Tuple[int, Any, Tuple[str, ...], Any, bool], Any] = {}

    def load_configuration(self: Any, config_name: Optional[str], overrides: List[str], run_mode: Any,
                           from_shell: bool = True, validate_sweep_overrides: bool = True) -> Any:
        lines = tuple(overrides)
        key = (id(self), config_name, lines, run_mode, from_shell)
        cfg = kept.pop(key, None)
        added: List[Any] = []
        if cfg is None and lines[-1:] == (_MODE_LINE,):
            cfg = kept.pop((id(self), config_name, lines[:-1], run_mode, from_shell), None)
            added = [_MODE_LINE]
        if cfg is not None and validate_sweep_overrides:
            try:
                parsed = OverridesParser.create().parse_overrides(overrides=list(lines))
                self.validate_sweep_overrides_legal(overrides=parsed, run_mode=run_mode, from_shell=from_shell)
                if added:
                    ConfigLoaderImpl._apply_overrides_to_config(parsed[-1:], cfg)
                    cfg.hydra.overrides.hydra.append(_MODE_LINE)
                return cfg
            except Exception:  # noqa: BLE001 - Hydra composes it again and says what is wrong in its own words
                pass
        cfg = original(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
        if not validate_sweep_overrides:  # get_mode's: composed once more by multirun
            kept[key] = cfg
        return cfg

    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = original  # type: ignore[method-assign]
