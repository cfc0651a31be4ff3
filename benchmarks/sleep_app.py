"""A small Hydra app for benchmarks/search.py (d): a trial sleeps 4-16 s (longer for larger x) and returns (x - 0.3)^2.

Plain Hydra, nothing of hpctrain imported: run by hpctrain's search sweeper and launchers as by Hydra's
Optuna sweeper over hydra-submitit-launcher.
"""

import time
from dataclasses import dataclass

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig


@dataclass
class SleepConfig:
    x: float = 0.5


ConfigStore.instance().store(name="sleep", node=SleepConfig)


@hydra.main(version_base=None, config_path=None, config_name="sleep")
def main(cfg: DictConfig) -> float:
    x = float(cfg.x)
    time.sleep(4 + 12 * x)
    return (x - 0.3) ** 2


if __name__ == "__main__":
    main()
