"""The classes Hydra finds: thin Launcher and Sweeper shells over :mod:`hpctrain.submit`.

Hydra imports this module at the start of every app in the environment (its plugin scan), so it
imports nothing of hpctrain: each shell loads its implementation in ``setup()``, which Hydra calls only
for the launcher or sweeper a config selects.
"""

import importlib
from typing import Any, Dict, List, Sequence

from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException



class SettingsError(CompactHydraException):
    """A launcher or sweeper setting of the wrong type or name: Hydra prints the message alone."""


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _typed(schema: str, params: Dict[str, Any], group: str) -> Dict[str, Any]:
    """``params`` checked against and converted by ``schema`` ("60" -> 60); one line naming the key if not."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(_load(schema)), params)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        message = str(getattr(exc, "msg", None) or exc).splitlines()[0]
        raise SettingsError(f"nothing submitted: {group}.{key}: {message}") from None
    typed = OmegaConf.to_container(merged, resolve=False)
    assert isinstance(typed, dict)  # a structured DictConfig gives a dict
    typed.pop("_target_", None)
    return {str(k): v for k, v in typed.items()}


class _Shell:
    """The settings Hydra passes, kept until ``setup()`` builds the implementation from them, typed."""

    implementation = ""
    schema = ""  # its dataclass in hpctrain.submit.settings (the search's: hpctrain.search.settings)
    group = ""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.impl: Any = None  # hpctrain.submit's launcher or sweeper, built in setup()

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.impl = _load(self.implementation)(**_typed(self.schema, self.params, self.group))
        self.impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)


class _LauncherShell(_Shell, Launcher):
    group = "hydra.launcher"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        assert self.impl is not None, "setup() first"
        return self.impl.launch(job_overrides, initial_job_idx)


class LocalLauncher(_LauncherShell):
    implementation = "hpctrain.submit.backends.local.LocalLauncher"
    schema = "hpctrain.submit.settings.LocalLauncherConf"


class SlurmLauncher(_LauncherShell):
    implementation = "hpctrain.submit.backends.slurm.SlurmLauncher"
    schema = "hpctrain.submit.settings.SlurmLauncherConf"


class _SweeperShell(_Shell, Sweeper):
    group = "hydra.sweeper"

    def sweep(self, arguments: List[str]) -> Any:
        assert self.impl is not None, "setup() first"
        return self.impl.sweep(arguments)


class HpctrainSweeper(_SweeperShell):
    implementation = "hpctrain.submit.sweeper.HpctrainSweeper"
    schema = "hpctrain.submit.settings.SweeperConf"


class SearchSweeper(_SweeperShell):
    implementation = "hpctrain.submit.search.SearchSweeper"
    schema = "hpctrain.search.settings.SearchSweeperConf"
