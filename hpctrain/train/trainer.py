"""The training loop: DDP, gradient accumulation, mixed precision, checkpoints, logging."""

import contextlib
import inspect
import logging
import math
import os
import socket
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler

from hpctrain.core import events as record
from hpctrain.core import paths as runfiles
from hpctrain.core import summary
from hpctrain.core.state import State
from hpctrain.job.preemption import PreemptionGuard
from hpctrain.search import bridge as search_bridge
from hpctrain.train import checkpoint, hparams, losses
from hpctrain.train.batches import batch_size_of, to_device, tokens_per_sample
from hpctrain.train.build import build_data, build_loss, build_metrics, build_model, build_optimizer
from hpctrain.train.distributed import DistInfo, allow_tf32
from hpctrain.train.evaluation import batch_value, weighted_means
from hpctrain.train.loggers import NullLogger, RunLogger, Throughput, peak_flops
from hpctrain.train.outputs import ModelOutputError, logits_of, loss_of

log = logging.getLogger(__name__)


def micro_batch_size(batch_size: int, world_size: int, grad_accum: int) -> int:
    per_step = world_size * grad_accum
    if batch_size % per_step:
        raise ValueError(
            f"batch_size={batch_size} must be divisible by world_size x grad_accum = {world_size} x {grad_accum}"
        )
    return batch_size // per_step


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warmup, then cosine decay to ``min_ratio`` of the peak."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class ShardedBatches(Sampler):
    """This rank's micro-batches of an epoch, from micro-batch ``skip`` on (the resumable data position).

    DistributedSampler's order: one seeded shuffle per epoch shared by all ranks, trimmed to a multiple
    of the world size, rank r taking every world_size-th index from r. So the ranks' micro-batches b
    together are the same samples whatever the world size. Batches come out as index tensors, which a
    data set with ``__getitems__`` takes in one indexing operation (lists of ints for any other).
    """

    def __init__(self, dataset: Dataset, info: DistInfo, seed: int, micro_bs: int) -> None:
        self.n, self.rank, self.world = len(dataset), info.rank, info.world_size
        self.seed, self.micro_bs = seed, micro_bs
        self.per_rank = self.n // self.world
        self.batches_per_epoch = self.per_rank // micro_bs
        self.as_tensor = hasattr(dataset, "__getitems__")
        self.epoch, self.skip = 0, 0

    def set_position(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[Any]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        mine = torch.randperm(self.n, generator=g)[: self.per_rank * self.world][self.rank :: self.world]
        for b in range(self.skip, self.batches_per_epoch):
            batch = mine[b * self.micro_bs : (b + 1) * self.micro_bs]
            yield batch if self.as_tensor else batch.tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch - self.skip


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: Path, info: DistInfo) -> None:
        self.cfg, self.run_dir, self.info = cfg, Path(run_dir), info
        self.device = info.device
        allow_tf32(self.device)
        self.grad_accum = cfg.grad_accum
        self.micro_bs = micro_batch_size(cfg.batch_size, info.world_size, cfg.grad_accum)
        checkpoint.seed_everything(cfg.seed)  # same initial weights on every rank

        splits = build_data(cfg.data)
        self.train_set, self.val_set = splits.train, splits.val
        self.raw_model = build_model(cfg.model).to(self.device)
        self.loss = build_loss(cfg.loss)
        if isinstance(self.loss, nn.Module):
            self.loss = self.loss.to(self.device)  # a loss class with buffers (class weights)
        # loss=model: pair batches call model(inputs, targets); dict batches take the model's loss with
        # the default cross_entropy too (a Hugging Face model computes it from the batch's labels)
        self.model_loss = self.loss is losses.from_model
        self.dict_model_loss = self.model_loss or self.loss is losses.cross_entropy
        if self.model_loss:
            takes_targets(self.raw_model, cfg.loss._target_)
        self.metric_fns = build_metrics(cfg.metrics)
        if info.is_main:
            summary.write(self.run_dir, max_steps=cfg.max_steps,
                          started=time.time(), world_size=info.world_size, host=socket.gethostname(),
                          pid=os.getpid())
        self.model = self._wrap(self.raw_model)
        self.optimizer = build_optimizer(cfg.optim, self.raw_model, cfg.lr, self.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(cfg.precision))

        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.sampler = ShardedBatches(self.train_set, info, cfg.seed, self.micro_bs)
        if self.sampler.batches_per_epoch == 0:
            raise ValueError(
                f"batch_size={cfg.batch_size}: a micro-batch of {self.micro_bs} is larger than this rank's "
                f"{self.sampler.per_rank} training samples"
            )
        self.ckpt_path = self.run_dir / runfiles.CKPT
        self.maybe_resume()
        self.logger = RunLogger(self.run_dir, self.step) if info.is_main else NullLogger()
        self.guard = PreemptionGuard()
        self.trial = search_bridge.current()  # the search trial this run is, or None

    # ------------------------------------------------------------------ setup
    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.cfg.compile:
            model = torch.compile(model)  # compile first, then DDP (torch docs' recommended order)
        if self.info.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        return model

    def _loader(self) -> DataLoader:
        collate = getattr(self.train_set, "collate", None)
        return DataLoader(
            self.train_set,
            batch_sampler=self.sampler,
            num_workers=self.cfg.num_workers,
            pin_memory=self.device.type == "cuda",
            collate_fn=collate,
            # its own generator: creating an iterator must not draw from the global RNG, or a resumed
            # run would see different random numbers (dropout, ...) than an uninterrupted one
            generator=torch.Generator().manual_seed(self.cfg.seed + self.epoch),
        )

    def batches(self) -> Iterator[Any]:
        """Micro-batches forever; (epoch, batch_in_epoch) is the resumable data position."""
        while True:
            self.sampler.set_position(self.epoch, self.batch_in_epoch)
            for batch in self._loader():
                self.batch_in_epoch += 1
                yield batch
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    # ------------------------------------------------------------------ state
    def state_dict(self, rng: Optional[list] = None) -> Dict[str, Any]:
        """``rng``: every rank's RNG state (gathered in save_checkpoint); default this process's."""
        return {
            "model": self.raw_model.state_dict(),  # unwrapped and uncompiled
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "data": {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch},
            "rng": rng if rng is not None else [checkpoint.rng_state(self.device)],
            "config": runfiles.redacted(self.cfg),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.epoch = int(state["data"]["epoch"])
        self.batch_in_epoch = int(state["data"]["batch_in_epoch"])
        checkpoint.restore_rng_states(state["rng"], self.info.rank, self.device)

    def maybe_resume(self) -> None:
        if self.info.is_main:
            checkpoint.remove_partial(self.ckpt_path)
        state, source = checkpoint.load(self.ckpt_path, map_location=self.device)  # last.pt, else previous.pt
        if state is not None:
            self.load_state_dict(state)
            log.info("resumed from %s at step %d", source, self.step)

    def save_checkpoint(self) -> None:
        rng = checkpoint.gather_rng_states(self.device, self.info.world_size)  # a collective: every rank's own
        if self.info.is_main:
            checkpoint.save_atomic(self.state_dict(rng), self.ckpt_path)
        if self.info.enabled:
            dist.barrier()  # nobody moves on (or exits for a requeue) before the checkpoint exists

    # ------------------------------------------------------------------ steps
    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def forward(self, model: nn.Module, batch: Any) -> Tuple[Any, Any]:
        """The model's output and the batch's targets: ``model(inputs)`` (``model(inputs, targets)`` with
        loss=model) for pairs, ``model(**batch)`` for dicts (Hugging Face's convention; targets: labels)."""
        if isinstance(batch, Mapping):
            return model(**batch), batch.get("labels")
        x, y = batch
        return (model(x, y) if self.model_loss else model(x)), y

    def loss_fn(self, outputs: Any, targets: Any, batch: Any) -> torch.Tensor:
        try:
            if self.model_loss or (self.dict_model_loss and isinstance(batch, Mapping)):
                return loss_of(outputs)
            return self.loss(logits_of(outputs), targets)  # the predictions: a tensor, (logits, ...), .logits
        except ModelOutputError as exc:
            raise ModelOutputError(f"loss._target_={self.cfg.loss._target_}: {exc}") from None

    def train_step(self, batches: Iterator) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.grad_accum):
            batch = to_device(next(batches), self.device)
            if self.info.enabled:
                # all-reduce gradients on the last micro-step only; earlier ones accumulate locally
                self.model.require_backward_grad_sync = micro == self.grad_accum - 1
            with self.autocast():
                loss = self.loss_fn(*self.forward(self.model, batch), batch) / self.grad_accum  # global batch mean
            self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        grad_norm = None
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return loss_sum, grad_norm

    @torch.no_grad()
    def evaluate(self, max_batches: int = 20) -> Dict[str, float]:
        """``val/loss`` and ``val/<metric>``: sample-weighted means over the same samples at any world size."""
        if self.val_set is None:
            return {}
        self.model.eval()
        n = min(len(self.val_set), max_batches * self.micro_bs * self.info.world_size)
        idx = list(range(self.info.rank, n, self.info.world_size))
        loader = DataLoader(self.val_set, batch_size=self.micro_bs, sampler=idx,
                            collate_fn=getattr(self.val_set, "collate", None))
        names = ["val/loss"] + [f"val/{name}" for name in self.metric_fns]
        totals = torch.zeros(len(names) + 1, device=self.device)  # sums of batch means x batch sizes, count
        for batch in loader:
            batch = to_device(batch, self.device)
            with self.autocast():
                outputs, targets = self.forward(self.raw_model, batch)
                values = [self.loss_fn(outputs, targets, batch).float()]
            if self.metric_fns:
                if targets is None:
                    raise ModelOutputError(f"metrics.{next(iter(self.metric_fns))}: the batch has no targets "
                                           f"(a dict batch needs 'labels')")
                preds = logits_of(outputs, f"metrics.{next(iter(self.metric_fns))}")
                values += [batch_value(name, fn, preds, targets) for name, fn in self.metric_fns.items()]
            size = batch_size_of(batch)
            totals += torch.stack(values + [torch.ones((), device=self.device)]) * size
        if self.info.enabled:
            dist.all_reduce(totals)
        self.model.train()
        return weighted_means(totals, names)

    def _log_step(self, mean_loss: torch.Tensor, grad_norm: Optional[torch.Tensor],
                  meter: Throughput) -> Tuple[Dict[str, float], bool]:
        """Log the interval's mean train loss (across ranks) and say whether any rank was signalled.

        One collective on log steps only; ``.tolist()`` here is the only host sync of the interval.
        """
        packed = torch.stack([mean_loss, torch.tensor(float(self.guard.requested), device=self.device)])
        if self.info.enabled:
            dist.all_reduce(packed)
            packed[0] /= self.info.world_size
        loss, stop = packed.tolist()
        values = {"train/loss": loss, "train/lr": self.scheduler.get_last_lr()[0], **meter.read()}
        if grad_norm is not None:
            values["train/grad_norm"] = float(grad_norm)
        self.logger.scalars(values, self.step)
        self.logger.progress(step=self.step, metrics=values)
        return values, stop > 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _flops_per_step(self) -> Optional[float]:
        per_sample = getattr(self.raw_model, "flops_per_sample", None)
        if per_sample is None:
            return None
        return per_sample() * self.cfg.batch_size

    def fit(self) -> Dict[str, Any]:
        cfg = self.cfg
        tokens = tokens_per_sample(self.train_set[0])  # 1, or the sequence length for an LM
        meter = Throughput(cfg.batch_size, tokens, self._flops_per_step(), peak_flops(self.device, str(cfg.precision)),
                           self.info.world_size, sync=self._sync)
        self.model.train()
        self.guard.install()
        started = time.time()
        self.logger.progress(step=self.step)
        batches = self.batches()
        loss_acc, interval = torch.zeros((), device=self.device), 0
        last: Dict[str, float] = {}
        while self.step < cfg.max_steps:
            loss, grad_norm = self.train_step(batches)
            loss_acc += loss  # stays on the device: no sync until the next log step
            interval += 1
            meter.step()
            last_step = self.step == cfg.max_steps
            # one rank alone acts on a preemption signal at once; several agree on it at log steps
            if self.step % cfg.log_every == 0 or last_step or (not self.info.enabled and self.guard.requested):
                last, stop = self._log_step(loss_acc / interval, grad_norm, meter)
                loss_acc.zero_()
                interval = 0
                if stop and not last_step:
                    self._preempted()
            if cfg.eval_every and self.step % cfg.eval_every == 0 and not last_step:
                with meter.paused():  # not training time: left out of tokens/s and MFU
                    self._log_eval(last)
                if self._should_prune(last):
                    return self._pruned(last, started)
            if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and not last_step:
                with meter.paused():
                    self.save_checkpoint()
        self._log_eval(last)  # the guard stays: a signal during the final eval and save must not requeue the run
        self.save_checkpoint()
        objective = {"metric": cfg.objective.metric, "mode": cfg.objective.mode,
                     "value": last.get(cfg.objective.metric)}
        result = {"status": State.COMPLETED.value, "step": self.step, "max_steps": cfg.max_steps, "metrics": last,
                  "objective": objective, "elapsed_s": time.time() - started}
        self.logger.finish(self._hparams_summaries(last))
        self.logger.progress(**result)
        self.logger.close()
        self.guard.uninstall()  # a signal that came after the last step is dropped: the run is done
        return result

    def _log_eval(self, last: Dict[str, float]) -> None:
        val = self.evaluate()
        if val:
            last.update(val)
            self.logger.scalars(val, self.step)

    def _should_prune(self, last: Dict[str, float]) -> bool:
        """A search trial: rank 0 reports the objective and asks the pruner; every rank takes its answer."""
        if self.trial is None:
            return False
        prune = self.trial.should_prune(last.get(self.trial.metric or ""), self.step) if self.info.is_main else False
        if self.info.enabled:
            flag = torch.tensor([float(prune)], device=self.device)
            dist.broadcast(flag, 0)  # one small collective at eval steps of a search only: all ranks stop together
            prune = bool(flag.item())
        return prune

    def _pruned(self, last: Dict[str, float], started: float) -> Dict[str, Any]:
        """Stopped early by the search's pruner: state ``pruned`` (not failed, never retried)."""
        log.info("pruned at step %d by the search's pruner (%s=%s)", self.step, self.trial.metric,
                 last.get(self.trial.metric or ""))
        self.guard.uninstall()
        if self.info.is_main:
            record.pruned(self.run_dir, step=self.step, reason="the search's pruner", rank=0)
        objective = {"metric": self.cfg.objective.metric, "mode": self.cfg.objective.mode,
                     "value": last.get(self.cfg.objective.metric)}
        result = {"status": State.PRUNED.value, "step": self.step, "max_steps": self.cfg.max_steps,
                  "metrics": last, "objective": objective, "elapsed_s": time.time() - started,
                  "pruned_at": self.step}
        self.logger.scalars({"search/pruned": 1.0}, self.step)
        self.logger.finish(self._hparams_summaries(last))
        self.logger.progress(**result)
        self.logger.close()
        return result

    def _preempted(self) -> None:
        log.warning("preemption/timeout signal: checkpointing at step %d, then requeue", self.step)
        self.save_checkpoint()
        self.logger.progress(step=self.step)  # the job's checkpoint() records the requeue
        self.logger.close()
        self.guard.hand_over()

    def _hparams_summaries(self, last: Dict[str, float]) -> list:
        """HParams: this run's command-line keys first; the objective, then the final values, as metrics."""
        from hydra.core.hydra_config import HydraConfig

        swept = hparams.swept_keys(HydraConfig.get().overrides.task) if HydraConfig.initialized() else {}
        flat = hparams.ordered(flatten(runfiles.redacted(self.cfg)), swept)
        tags = [self.cfg.objective.metric] + [k for k in last if k != self.cfg.objective.metric]
        return hparams.summaries(flat, [t for t in tags if t in last and not t.startswith("perf/")], swept)


def takes_targets(model: nn.Module, loss_target: str) -> None:
    """loss=model calls ``model(inputs, targets)``: say so at once if its forward takes one argument."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise TypeError(f"loss._target_={loss_target}: {type(model).__name__}.forward takes no targets; expected "
                        f"forward(inputs, targets) returning a scalar loss, (logits, loss) or an object with .loss")


def flatten(node: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"model": {"hidden": 8}}`` -> ``{"model.hidden": 8}``, leaves as TensorBoard hparam values."""
    out: Dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def error_tail(exc: BaseException, lines: int = 15) -> str:
    text = "".join(traceback.format_exception(exc))
    return "\n".join(text.rstrip().splitlines()[-lines:])
