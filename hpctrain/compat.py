"""Every private API of Hydra, OmegaConf, submitit and TensorBoard that hpctrain uses, in one place.

These are the names a new release of those libraries may move without notice; the pins in
pyproject.toml are as wide as the versions CI runs the tests against (``.ci/run`` runs the login-node
tests against the oldest and the newest supported hydra-core and omegaconf). When a release breaks
one of these, this module is the one to change. Imports are done where each is used, so that
nothing heavy is loaded on the login node for a name it does not need (no torch here).
"""

import contextlib
import functools
from typing import Any, Iterator, List, Optional

# Hydra: the basic sweeper's class (hpctrain's sweeper extends it; review expands a sweep with its
# split_arguments) and the config loader's internals used to plan 1000 points without composing each.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname  # noqa: F401
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: F401


def apply_overrides(overrides: List[Any], cfg: Any) -> None:
    """Hydra's own application of parsed value overrides to a config (type checks of structured configs)."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


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


# submitit
def convert_mem(mem_gb: float) -> str:
    """submitit's sbatch ``--mem`` value for a size in GB."""
    from submitit.slurm.slurm import _convert_mem

    return _convert_mem(mem_gb)


def make_sbatch_string(**params: Any) -> str:
    """The sbatch script submitit would submit (for ``dry_run``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(**params)


def preemption_signal() -> Any:
    """The signal submitit sends before the time limit or on preemption (USR2 unless configured)."""
    from submitit import JobEnvironment

    return JobEnvironment._usr_sig()


def local_job_exit_code(job: Any) -> Optional[int]:
    """The exit code of a submitit LocalJob's controller process (None while it runs or if unknown)."""
    process = getattr(job, "_process", None)
    return process.poll() if process is not None else None


# TensorBoard (torch.utils.tensorboard)
def file_writer(summary_writer: Any) -> Any:
    """The SummaryWriter's underlying FileWriter, to add the HParams summaries it has no public call for."""
    return summary_writer._get_file_writer()
