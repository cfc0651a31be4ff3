"""Compose hpctrain's config in-process and compare weights (for tests that drive the Trainer)."""

from typing import Dict, List

import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from omegaconf import DictConfig

from hpctrain.config import register_configs


def compose(overrides: List[str]) -> DictConfig:
    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def state_close(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)
