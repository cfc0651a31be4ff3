"""A user's Hydra app with its own OmegaConf resolver, as a run-dir template may use one.

``${where:}`` says which side resolves it: ``job`` inside a submitit job, ``login`` elsewhere; a run dir
resolved again on the compute node would land somewhere else than the one planned on the login node.
"""

import os

import hydra
from omegaconf import DictConfig, OmegaConf

OmegaConf.register_new_resolver("where", lambda: "job" if os.environ.get("SUBMITIT_EXECUTOR") else "login")


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig):
    x = float(cfg.get("x", 0.0))
    if cfg.get("fail_above") is not None and x > float(cfg.fail_above):
        raise RuntimeError(f"x={x} is above fail_above={cfg.fail_above}")  # retried: no class of a bug
    return {"loss": (x - 1.0) ** 2}


if __name__ == "__main__":
    main()
