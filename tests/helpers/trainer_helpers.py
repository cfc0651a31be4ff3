"""Compose hpctrain's config in-process and compare weights (for tests that drive the Trainer)."""

import os
import socket
from typing import Any, Callable, Dict, List

import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from omegaconf import DictConfig

from hpctrain.schema import register_configs


def compose(overrides: List[str]) -> DictConfig:
    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def state_close(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit(trainer: Any) -> None:
    trainer.fit()


def gloo_ranks(world: int, overrides: List[str], run_dir: Any, body: Callable[[Any], Any] = fit) -> Dict[int, Any]:
    """``world`` gloo ranks on this machine (torch.multiprocessing), each building the Trainer of ``overrides``
    in ``run_dir`` and calling ``body(trainer)`` (a module-level function: it is pickled by name); what
    each rank's ``body`` returned, by rank."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_main, args=(world, free_port(), overrides, str(run_dir), body, out), nprocs=world)
        return dict(out)


def _rank_main(rank: int, world: int, port: int, overrides: List[str], run_dir: str, body: Callable[[Any], Any],
               out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from hpctrain.train.distributed import init_distributed, teardown
    from hpctrain.train.trainer import Trainer

    trainer = Trainer(compose(overrides), run_dir, init_distributed("cpu"))
    try:
        out[rank] = body(trainer)
    finally:
        teardown()
