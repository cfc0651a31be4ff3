"""A user's own Hydra app, as a researcher writes one: nothing of hpctrain is imported here.

Its return value, a dict of numbers (or one number with ``+number_only=true``), is what hpctrain's
launchers record as the run's final metrics.
"""

import time

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig):
    x = float(cfg.get("x", 0.0))
    if cfg.get("sleep_s"):
        time.sleep(float(cfg.sleep_s))  # a point's work, for the pull workers' tests and benchmarks/pull_grid.py
    if cfg.get("bad_config"):
        raise ValueError(f"bad_config={cfg.bad_config}: expected nothing here")  # a bug: the same on every attempt
    if cfg.get("fail_above") is not None and x > float(cfg.fail_above):
        raise RuntimeError(f"x={x} is above fail_above={cfg.fail_above}")  # retried: no class of a bug
    loss = (x - 1.0) ** 2
    if cfg.get("number_only"):
        return loss
    return {"loss": loss, "score": -abs(x - 1.0)}


if __name__ == "__main__":
    main()
