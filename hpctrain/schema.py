"""Structured configs: the schema behind ``conf/``.

Every option is a dataclass registered in Hydra's ConfigStore, so an unknown key or a value of the
wrong type fails when Hydra composes the config, before anything runs or is submitted. The YAML files
in ``conf/`` pick these schemas through their defaults lists and hold the values users edit.

This module must stay light: it is imported on login nodes (no torch here).
"""

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, OmegaConf

PRECISIONS = ("32", "bf16", "fp16")
OBJECTIVE_MODES = ("min", "max")
# The keys the trainer applies to a run in flight (Trainer.retune, on resume and at a ``schedule`` step):
# the base learning rate, gradient clipping and the optimizer's param-group values. Every other key (model
# shape, data, batch size, seed, ...) is fixed for a run's life: scheduler=pbt may explore only these.
RETUNABLE = ("lr", "grad_clip", "optim.weight_decay", "optim.momentum", "optim.eps", "optim.dampening",
             "optim.betas")


def read_schedule(entries: Any, optim_keys: Optional[Any] = None) -> Dict[int, Dict[str, Any]]:
    """The ``schedule`` key, ``[{step: N, lr: ..., optim.weight_decay: ...}, ...]``, as ``{N: {key: value}}``:
    from step N on, those values (a PBT trial's schedule replayed as one run). ``optim_keys``: the keys of
    the config's ``optim`` (where given, an ``optim.<key>`` the optimizer does not take is refused too)."""
    out: Dict[int, Dict[str, Any]] = {}
    for i, entry in enumerate(entries or ()):
        entry = dict(entry)
        step = entry.pop("step", None)
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"schedule[{i}]: expected an integer step >= 0, got {step!r}")
        for key in entry:
            if key not in RETUNABLE:
                raise ValueError(f"schedule[{i}].{key}: cannot change during a run "
                                 f"(expected one of {', '.join(RETUNABLE)})")
            if optim_keys is not None and key.startswith("optim.") and key[len("optim."):] not in optim_keys:
                raise ValueError(f"schedule[{i}].{key}: the optimizer's config has no {key[len('optim.'):]!r}")
        out.setdefault(step, {}).update(entry)
    return out

# ---------------------------------------------------------------- model
@dataclass
class MLPConfig:
    _target_: str = "hpctrain.train.models.mlp.MLP"
    in_features: int = II("data.num_features")
    num_classes: int = II("data.num_classes")
    hidden: int = 256
    depth: int = 2


@dataclass
class CNNConfig:
    _target_: str = "hpctrain.train.models.cnn.CNN"
    in_channels: int = II("data.channels")
    num_classes: int = II("data.num_classes")
    width: int = 32


@dataclass
class GPTConfig:
    _target_: str = "hpctrain.train.models.gpt.GPT"
    vocab_size: int = II("data.vocab_size")
    block_size: int = II("data.seq_len")
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_pad_to: int = 1  # round the vocabulary up to a multiple of this (64: tensor-core friendly shapes)


# ---------------------------------------------------------------- data
@dataclass
class ClassificationDataConfig:
    """Points drawn around class centres in ``num_features`` dimensions (a learnable signal)."""

    _target_: str = "hpctrain.train.datasets.synthetic.gaussian_classes"
    num_features: int = 32
    num_classes: int = 8
    train_size: int = 16384
    val_size: int = 2048
    noise: float = 4.0  # overlapping classes: a loss floor well above 0, so runs differ
    seed: int = 1234


@dataclass
class ImageDataConfig:
    """Small images whose class is where a bright square sits, plus noise."""

    _target_: str = "hpctrain.train.datasets.synthetic.square_images"
    image_size: int = 16
    channels: int = 1
    num_classes: int = 4
    train_size: int = 8192
    val_size: int = 1024
    noise: float = 0.5
    seed: int = 1234
    # an image's flat size, for models that take vectors (model=mlp): follows channels and image_size
    num_features: int = II("hpctrain.product:${.channels},${.image_size},${.image_size}")


@dataclass
class TokenDataConfig:
    """Token sequences from a sparse random Markov chain: a language model can learn it."""

    _target_: str = "hpctrain.train.datasets.synthetic.markov_tokens"
    vocab_size: int = 64
    seq_len: int = 64
    train_size: int = 4096
    val_size: int = 256
    branching: int = 4
    seed: int = 1234


@dataclass
class RegressionDataConfig:
    """Real-valued targets: a smooth function of the inputs plus noise (``data=regression`` picks ``loss=mse``)."""

    _target_: str = "hpctrain.train.datasets.synthetic.smooth_regression"
    num_features: int = 32
    num_targets: int = 1
    train_size: int = 16384
    val_size: int = 2048
    noise: float = 0.1  # a loss floor of about noise**2
    seed: int = 1234
    # the models' output layer is sized by data.num_classes: one output per target value here
    num_classes: int = II(".num_targets")


# ---------------------------------------------------------------- optim
@dataclass
class AdamWConfig:
    _target_: str = "torch.optim.AdamW"
    betas: Tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: Optional[bool] = None  # None: fused on CUDA, plain elsewhere


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0


# ---------------------------------------------------------------- objective
@dataclass
class ObjectiveConfig:
    """What a sweep optimises: a metric the run logs (``val/<name>`` for each of ``metrics``)."""

    metric: str = "val/loss"
    mode: str = "min"  # one of OBJECTIVE_MODES


# ---------------------------------------------------------------- top level
@dataclass
class TrainConfig:
    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING
    loss: Any = MISSING  # conf/loss/: cross_entropy | mse | model, or any callable by _target_
    metrics: Dict[str, Any] = field(default_factory=dict)  # name -> callable (outputs, targets) -> tensor
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    lr: float = 3e-3
    batch_size: int = 64  # global: across ranks and accumulation steps
    grad_accum: int = 1
    max_steps: int = 200
    seed: int = 0
    precision: str = "32"  # one of PRECISIONS
    compile: bool = False
    log_every: int = 10
    eval_every: int = 100  # 0: no evaluation until the end
    eval_batches: int = 20  # micro-batches per evaluation (the first samples of the validation set); 0: all of it
    ckpt_every: int = 100  # 0: only at the end (and on preemption)
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    # [{step: N, lr: ..., optim.weight_decay: ...}]: from step N on, those values (a PBT schedule replayed)
    schedule: Optional[List[Any]] = None
    grad_clip: float = 1.0  # 0: no clipping
    max_nonfinite: int = 0  # log steps in a row whose loss may be NaN/Inf before the run fails (0: the first)
    # hang watchdog (hpctrain.job.watchdog): seconds a rank may go without a step before the attempt is ended
    # `hung` and retried. None: max(300 s, 10 x the longest wait between steps after warm-up); 0: no watchdog
    hang_timeout_s: Optional[float] = None
    # joining the process group, building the model and data, loading the checkpoint. None: hang_first_step_s
    hang_setup_s: Optional[float] = None
    hang_first_step_s: float = 1800.0  # the first steps (a compile)
    hang_eval_s: float = 1800.0  # one evaluation
    hang_checkpoint_s: float = 900.0  # one checkpoint save
    # stragglers (hpctrain.job.straggler): a rank whose own work per step is >= straggler_factor x the other
    # ranks' median in straggler_windows log windows in a row is flagged (status, the tab, report); 0: off
    straggler_factor: float = 1.3
    straggler_windows: int = 3
    device: str = "auto"  # auto | cpu | cuda
    num_workers: int = 0


# hydra.sweep.subdir of conf/config.yaml: the launcher's plan fills it in with :func:`dirname` directly.
DIRNAME_TEMPLATE = "${hpctrain.dirname:${hydra.job.num},${hydra.job.override_dirname}}"


def dirname(num: int, overrides: str, limit: int = 120) -> str:
    """A run directory name, ``<num>_<swept values>``: one path component, of bounded length.

    ``/`` in a value (a path) would nest directories, and names over 255 bytes cannot be created.
    """
    overrides = "" if overrides is None else str(overrides)
    name = f"{num}_{overrides}".replace("/", "%2F") if overrides else str(num)
    if len(name) > limit:
        name = name[: limit - 9] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return name


def product(*factors: int) -> int:
    """``${hpctrain.product:a,b,...}``: a size derived from others (an image's flat size)."""
    return math.prod(int(f) for f in factors)


def register_configs() -> None:
    OmegaConf.register_new_resolver("hpctrain.dirname", dirname, replace=True)
    OmegaConf.register_new_resolver("hpctrain.product", product, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=TrainConfig)
    for group, name, node in (
        ("model", "mlp_schema", MLPConfig),
        ("model", "cnn_schema", CNNConfig),
        ("model", "gpt_schema", GPTConfig),
        ("data", "classification_schema", ClassificationDataConfig),
        ("data", "images_schema", ImageDataConfig),
        ("data", "tokens_schema", TokenDataConfig),
        ("data", "regression_schema", RegressionDataConfig),
        ("optim", "adamw_schema", AdamWConfig),
        ("optim", "sgd_schema", SGDConfig),
    ):
        cs.store(group=group, name=name, node=node)
