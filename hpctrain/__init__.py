"""hpctrain: Hydra sweeps on Slurm with submitit, Apptainer and a DDP trainer.

``hpctrain.load(SWEEP_DIR)``, ``hpctrain.launch(OVERRIDES)`` and ``hpctrain.compare(DIRS)`` are the Python API
(:mod:`hpctrain.api`), imported on first use: ``import hpctrain`` itself stays free (jobs import it too).
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "launch", "compare", "Sweep", "Run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hpctrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
