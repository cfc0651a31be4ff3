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


@contextlib.contextmanager
def compositions_shared() -> Iterator[None]:
    """Within this, compositions with the same config-group choices share their defaults list and composed
    groups: the first is composed by Hydra, each later one gets a copy of it, then Hydra's own rest of the
    composition (its value overrides applied, its ``hydra.overrides`` and runtime). ``python -m hpctrain -m``
    composes three times with the same choices (the key check's, Hydra's, the plan's base), and the defaults
    list and the merge of the group configs are about two thirds of each. Shared when the same config name,
    config sources (search path included) and group overrides, in order, are asked for; a composition of
    Hydra's run mode (a missing group default is an error there) shares one of its multirun mode only where
    no group default was skipped as missing. A failing composition is not kept: Hydra composes it again."""
    from hydra._internal import config_loader_impl as loader_module
    from hydra._internal import defaults_list as defaults_module

    create, compose = loader_module.create_defaults_list, ConfigLoaderImpl._compose_config_from_defaults_list
    check = defaults_module._check_not_missing
    kept: Dict[Tuple[Any, bool], Tuple[Any, bool]] = {}  # (choices key, skip_missing) -> (defaults list, skipped)
    composed: Dict[int, Any] = {}  # id of a kept defaults list's defaults -> the groups as composed, untouched

    def shared_create(repo: Any, config_name: Optional[str], overrides_list: List[Any], prepend_hydra: bool,
                      skip_missing: bool) -> Any:
        key = _choices_key(repo, config_name, overrides_list, prepend_hydra)
        if key is None:
            return create(repo, config_name, overrides_list, prepend_hydra, skip_missing)
        hit = kept.get((key, skip_missing))
        if hit is None and not skip_missing and (key, True) in kept and not kept[(key, True)][1]:
            hit = kept[(key, True)]  # nothing was skipped as missing: run mode lists the same defaults
        if hit is not None:
            found = hit[0]
            values = [o for o in overrides_list if not o.is_sweep_override()
                      and (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group))]
            return type(found)(defaults=found.defaults, config_overrides=values, defaults_tree=found.defaults_tree,
                               overrides=found.overrides)
        skipped: List[bool] = []

        def noted(repo: Any, default: Any, skip_missing: bool) -> bool:
            missing = check(repo=repo, default=default, skip_missing=skip_missing)
            skipped.append(missing)
            return missing

        defaults_module._check_not_missing = noted
        try:
            result = create(repo, config_name, overrides_list, prepend_hydra, skip_missing)
        finally:
            defaults_module._check_not_missing = check
        kept[(key, skip_missing)] = (result, any(skipped))
        return result

    def shared_compose(self: Any, defaults: List[Any], repo: Any) -> Any:
        import copy

        first = composed.get(id(defaults))
        if first is not None:
            return copy.deepcopy(first)
        cfg = compose(self, defaults=defaults, repo=repo)
        if any(found.defaults is defaults for found, _ in kept.values()):
            composed[id(defaults)] = copy.deepcopy(cfg)  # the callers edit theirs (struct, overrides)
        return cfg

    loader_module.create_defaults_list = shared_create
    ConfigLoaderImpl._compose_config_from_defaults_list = shared_compose  # type: ignore[method-assign]
    try:
        with _repository_copied_on_change():
            yield
    finally:
        loader_module.create_defaults_list = create
        ConfigLoaderImpl._compose_config_from_defaults_list = compose  # type: ignore[method-assign]


@contextlib.contextmanager
def _repository_copied_on_change() -> Iterator[None]:
    """Hydra's per-composition config repository deep-copies the loader's whole repository (ConfigStore
    source included: about a tenth of a composition, and the key check asks for one per group it lists)
    so that a ``hydra.searchpath`` in the primary config cannot change the loader's; within this, it is
    copied when its sources are changed, the only write to it."""
    import copy

    from hydra._internal.config_repository import CachingConfigRepository

    init, initialize = CachingConfigRepository.__init__, CachingConfigRepository.initialize_sources

    def shared_init(self: Any, delegate: Any) -> None:
        self.delegate, self.cache, self._hpctrain_shared = delegate, {}, True

    def copy_then_initialize(self: Any, config_search_path: Any) -> None:
        if getattr(self, "_hpctrain_shared", False):
            self.delegate, self._hpctrain_shared = copy.deepcopy(self.delegate), False
        initialize(self, config_search_path)

    CachingConfigRepository.__init__ = shared_init  # type: ignore[method-assign]
    CachingConfigRepository.initialize_sources = copy_then_initialize  # type: ignore[method-assign]
    try:
        yield
    finally:
        CachingConfigRepository.__init__ = init  # type: ignore[method-assign]
        CachingConfigRepository.initialize_sources = initialize  # type: ignore[method-assign]


def _choices_key(repo: Any, config_name: Optional[str], overrides: List[Any], prepend_hydra: bool) -> Optional[Any]:
    """What a defaults list depends on: the config, its sources and the group overrides in order (Hydra's
    ``Overrides`` sorts them out the same way); None for a group override Hydra refuses (it says why)."""
    groups = []
    for o in overrides:
        if o.is_sweep_override() or isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group):
            continue
        if o.is_force_add() or not isinstance(o.value(), (str, list)) and not o.is_delete():
            return None
        groups.append((o.type.name, o.get_key_element(), repr(o.value())))
    sources = tuple((s.provider, s.path) for s in repo.get_sources())
    return config_name, prepend_hydra, sources, tuple(groups)
