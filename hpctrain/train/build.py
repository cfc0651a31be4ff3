"""Factories: model, data, optimizer, loss and metrics from their config slices (Hydra instantiate).

A user's own class plugs in with ``model._target_=pkg.Net``. Keys of the group's default schema that
the user's constructor does not take (say ``hidden`` for a ``Net(in_features, num_classes)``) are left
out, with a log line, so swapping the target alone is enough.
"""

import functools
import inspect
import logging
from typing import Any, Callable, Dict

import torch
from hydra.utils import get_method, get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from hpctrain.train.datasets.synthetic import Splits

log = logging.getLogger(__name__)


def _accepted(cfg: DictConfig, extra: dict) -> DictConfig:
    target = get_method(cfg._target_)
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return cfg
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return cfg
    node = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(node, dict)  # a DictConfig gives a dict
    dropped = [str(k) for k in node if k != "_target_" and k not in params and k not in extra]
    if dropped:
        log.info("%s does not take %s: left out", cfg._target_, ", ".join(dropped))
    return OmegaConf.create({k: v for k, v in node.items() if k not in dropped})


def build(cfg: DictConfig, **extra: Any) -> Any:
    return instantiate(_accepted(cfg, extra), _convert_="all", **extra)


def build_model(cfg: DictConfig) -> nn.Module:
    model = build(cfg)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={cfg._target_} built a {type(model).__name__}, expected a torch.nn.Module")
    return model


def build_data(cfg: DictConfig) -> Splits:
    data = build(cfg)
    if isinstance(data, Splits):
        return data
    if isinstance(data, Dataset):
        return Splits(train=data)
    if hasattr(data, "train"):
        return Splits(train=data.train, val=getattr(data, "val", None))
    raise TypeError(f"data._target_={cfg._target_} built a {type(data).__name__}, expected a Dataset or .train/.val")


def param_groups(model: nn.Module, weight_decay: float) -> list:
    """Weight decay on matrices and embeddings only, not on biases and norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: DictConfig, model: nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    if "fused" in cfg and cfg.fused is None:
        # fused kernels on CUDA; a config key (not a keyword) so that optimizers without it drop it
        merged = OmegaConf.merge(cfg, {"fused": True if device.type == "cuda" else None})
        assert isinstance(merged, DictConfig)
        cfg = merged
    groups = param_groups(model, float(cfg.get("weight_decay", 0.0)))
    return build(cfg, params=groups, lr=lr)


def build_callable(cfg: DictConfig, key: str) -> Callable[..., Any]:
    """A callable from ``{_target_: ..., **keys}``: a function is referenced (its keys bound, as Hydra's
    ``_partial_``), a class is built with its keys and the instance is what gets called."""
    try:
        target = get_object(cfg._target_)
    except Exception as exc:
        raise ValueError(f"{key}._target_={cfg._target_!r}: cannot import it ({exc})") from exc
    if not callable(target):
        raise TypeError(f"{key}._target_={cfg._target_!r} is a {type(target).__name__}, expected a callable "
                        f"(outputs, targets) -> tensor, or a class whose instances are one")
    built = instantiate(cfg, _convert_="all", _partial_=not inspect.isclass(target))
    if not callable(built):
        raise TypeError(f"{key}._target_={cfg._target_!r} built a {type(built).__name__}, which is not callable; "
                        f"expected (outputs, targets) -> tensor")
    if isinstance(built, functools.partial) and not built.args and not built.keywords:
        return built.func  # a plain reference: keep the function itself (the trainer compares it)
    return built


def build_loss(cfg: DictConfig) -> Callable[..., Any]:
    return build_callable(cfg, "loss")


def build_metrics(cfg: DictConfig) -> Dict[str, Callable[..., Any]]:
    return {str(name): build_callable(node, f"metrics.{name!s}") for name, node in cfg.items()}
