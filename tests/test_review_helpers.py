"""A model for the review tests' sweeps (no tests here): the jobs import it, with tests/ on PYTHONPATH.

``LrBoom`` trains like a small MLP, except in the run whose ``lr`` is ``boom_lr``, where its forward
raises in training (the trainer's check before step 0 runs it in eval mode): one sweep then holds runs of
different outcomes, the failed one with its TensorBoard folder.
"""

import torch
from hydra.core.hydra_config import HydraConfig
from torch import nn


def run_lr() -> float:
    task = HydraConfig.get().overrides.task
    return float(next(o.split("=", 1)[1] for o in task if o.startswith("lr=")))


class LrBoom(nn.Module):
    def __init__(self, in_features: int, num_classes: int, boom_lr: float, hidden: int = 64, **_: object) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        self.boom = run_lr() == boom_lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.boom and self.training:
            raise RuntimeError("LrBoom: this run fails on purpose")
        return self.body(x)
