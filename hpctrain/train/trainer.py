"""The training loop: DDP, gradient accumulation, mixed precision; checkpoints, data and hooks in their own objects."""

import contextlib
import logging
import math
import os
import socket
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, cast

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain.core import events, summary
from hpctrain.core import paths as runfiles
from hpctrain.core.redact import redact_config
from hpctrain.core.state import State
from hpctrain.job import hardware, lifecycle, straggler
from hpctrain.job.heartbeat import START, STEP, Phase, for_this_rank
from hpctrain.schema import RETUNABLE, read_schedule
from hpctrain.train import hparams, preflight
from hpctrain.train.batches import tokens_per_sample
from hpctrain.train.build import build_data, build_loss, build_metrics, build_model, build_optimizer
from hpctrain.train.checkpointer import Checkpointer, seed_everything
from hpctrain.train.distributed import AgreedFlag, DistInfo, allow_tf32
from hpctrain.train.evaluation import evaluate
from hpctrain.train.forward import Forward
from hpctrain.train.hooks import TrainerHook
from hpctrain.train.loader import MicroBatches, ShardedBatches
from hpctrain.train.nonfinite import NonFiniteGuard
from hpctrain.train.loggers import NullLogger, RunLogger, Throughput, peak_flops

log = logging.getLogger(__name__)
_NO_AUTOCAST = contextlib.nullcontext()  # reusable: entered and left every micro-step at full precision
_now = time.perf_counter  # a rank's own work per step (hpctrain.job.straggler): two reads a step


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




@dataclass(frozen=True)
class Every:
    """The loop's intervals and limits as plain numbers."""

    log: int
    eval: int
    max_steps: int
    grad_clip: float
    end: int  # where this run stops: max_steps, or a search unit's end step (paused there)


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: Path, info: DistInfo, hooks: Sequence[TrainerHook] = ()) -> None:
        self.cfg, self.run_dir, self.info, self.hooks = cfg, Path(run_dir), info, list(hooks)
        self.heart = for_this_rank(info.rank, info.local_rank)  # the watchdog's input: a few integers in /dev/shm
        self.device = info.device
        allow_tf32(self.device)
        self.grad_accum = cfg.grad_accum
        # read once: a DictConfig attribute costs microseconds, and the loop asks these every step
        self.every = Every(log=int(cfg.log_every), eval=int(cfg.eval_every or 0), max_steps=int(cfg.max_steps),
                           grad_clip=float(cfg.grad_clip), end=unit_end(self.hooks, int(cfg.max_steps)))
        self.micro_bs = micro_batch_size(cfg.batch_size, info.world_size, cfg.grad_accum)
        seed_everything(cfg.seed)  # same initial weights on every rank

        splits = build_data(cfg.data)
        self.train_set, self.val_set = splits.train, splits.val
        self.raw_model = build_model(cfg.model).to(self.device)
        loss = build_loss(cfg.loss)
        if isinstance(loss, nn.Module):
            loss = loss.to(self.device)  # a loss class with buffers (class weights)
        self.forward = Forward(loss, cfg.loss._target_, self.raw_model)
        self.metric_fns = build_metrics(cfg.metrics)
        self.metric_fns = preflight.check(cfg, self.raw_model, self.forward, self.train_set, self.metric_fns,
                                          self.device)
        if info.is_main:
            summary.write(self.run_dir, max_steps=cfg.max_steps, started=time.time(),
                          world_size=info.world_size, host=socket.gethostname(), pid=os.getpid())
        self.model = self._wrap(self.raw_model)
        self.optimizer = build_optimizer(cfg.optim, self.raw_model, cfg.lr, self.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.scaling = self.scaler.is_enabled()  # fp16 only: otherwise the scaler's four calls a step are skipped
        self.distributed = info.enabled  # read every step: a plain attribute, not a property
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(cfg.precision))

        self.step = 0
        self.spent_graph: Optional[torch.Tensor] = None  # the last micro-step's loss, its graph spent by backward
        sampler = ShardedBatches(self.train_set, info, cfg.seed, self.micro_bs)
        if sampler.batches_per_epoch == 0:
            raise ValueError(f"batch_size={cfg.batch_size}: a micro-batch of {self.micro_bs} is larger than this "
                             f"rank's {sampler.per_rank} training samples")
        self.data = MicroBatches(self.train_set, sampler, self.device, cfg.num_workers, cfg.seed)
        self.checkpointer = Checkpointer(self.run_dir / runfiles.CKPT, cfg.ckpt_every, info, self, self.data)
        self.schedule = read_schedule(cfg.get("schedule"))
        self.nonfinite = NonFiniteGuard(int(cfg.max_nonfinite))
        self.checkpointer.load()  # the newest complete checkpoint, if any: sets step, data position, RNG
        layout = hparams.layout(cfg.objective.metric, list(self.metric_fns))
        self.retune(self._values_at(self.step))  # the config's values (and the schedule's) over the checkpoint's
        self.logger = RunLogger(self.run_dir, self.step, layout, int(cfg.max_steps)) if info.is_main else NullLogger()
        if self.step == 0:  # HParams lists the run from its start (a resumed run's older event file has it)
            self.logger.start(hparams.start_summaries(cfg, self.run_dir))
        self.evaluated_at: Optional[int] = None
        self.stop_flag = AgreedFlag(info)  # several ranks: a stop request agreed on one step later
        # each rank's own work since the last log step, outside the gradient all-reduce (hpctrain.job.straggler)
        self.own_s, self.own_from = 0.0, 0.0
        judge = straggler.detector_of(cfg, lambda rank: hardware.node_of(self.run_dir, rank, info.rank))
        self.judged = self.distributed and judge is not None  # every rank sends its figure with the loss
        self.judge = judge if self.judged and info.is_main else None  # rank 0 judges and records
        self.stragglers_shown: Dict[int, float] = {}  # rank -> the factor metrics.json shows (one decimal)
        if self.judge is not None:
            summary.write(self.run_dir, stragglers=[])  # this attempt's: none yet (an earlier attempt's are gone)
        # a GPU runs behind its host, whose clock then times the launches, not the kernels: there the last step
        # of each log window is timed by two CUDA events instead, read after the log step's sync, sent a window later
        self.gpu_marks = device_marks(self.device) if self.judged else None
        self.gpu_own = 0.0

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.cfg.compile:
            model = cast(nn.Module, torch.compile(model))  # compile first, then DDP (torch docs' recommended order)
        if self.info.enabled:
            model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return model

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """The trainer's part of ``last.pt``; the Checkpointer adds the data position and the RNG states."""
        return {"model": self.raw_model.state_dict(),  # unwrapped and uncompiled
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(), "step": self.step, "config": redact_config(self.cfg)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])

    def _values_at(self, step: int) -> Dict[str, Any]:
        cfg = self.cfg
        values: Dict[str, Any] = {"lr": cfg.lr, "grad_clip": cfg.grad_clip}
        values.update({f"optim.{k}": v for k, v in cfg.optim.items() if k not in ("_target_", "fused")})
        for at in sorted(s for s in self.schedule if s <= step):
            values.update(self.schedule[at])
        return values

    def retune(self, values: Mapping[str, Any]) -> None:
        """Set ``lr`` (the scheduler's base values), ``grad_clip`` and ``optim.<key>`` (the param groups'
        values) where they differ from the current ones: a loaded checkpoint holds the values it was saved
        with, and a PBT explore or a schedule's entry changes them. Equal values are left untouched, so a
        plain resume stays bit-exact."""
        groups, sched = self.optimizer.param_groups, self.scheduler
        for key, value in values.items():
            if key == "lr":
                for i, group in enumerate(groups):
                    if sched.base_lrs[i] != float(value):
                        sched.base_lrs[i] = group["initial_lr"] = float(value)
                        group["lr"] = float(value) * sched.lr_lambdas[i](sched.last_epoch)
            elif key == "grad_clip":
                if self.every.grad_clip != float(value):
                    self.every = replace(self.every, grad_clip=float(value))
            elif key in RETUNABLE:
                name = key[len("optim."):]
                if not any(name in group for group in groups):
                    if self.cfg.optim.get(name) == value:  # the optimizer took its own kwarg and kept no copy
                        continue
                    # e.g. a schedule's optim.momentum for AdamW: it would silently change nothing
                    raise ValueError(f"{key}: the optimizer {type(self.optimizer).__name__} has no {name!r} "
                                     f"to change (its param groups hold {', '.join(sorted(groups[0]))})")
                for i, group in enumerate(groups):
                    if name in group and not (name == "weight_decay" and i > 0):  # biases and gains keep 0
                        old = group[name]
                        group[name] = tuple(value) if isinstance(old, tuple) else value if old is None else type(old)(value)

    # ------------------------------------------------------------------ steps
    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return _NO_AUTOCAST  # one shared no-op context: the loop enters it every micro-step
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self, fetch_ahead: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One optimizer step over ``grad_accum`` micro-batches; ``fetch_ahead``: the next step's first too."""
        loss_sum: Optional[torch.Tensor] = None
        if not fetch_ahead and self.gpu_marks:  # the window's last step, on a GPU: its own work from here
            self.gpu_marks[0].record()
        for micro in range(self.grad_accum):
            last = micro == self.grad_accum - 1
            batch = self.data.take()
            if self.distributed:
                self.model.require_backward_grad_sync = last  # all-reduce on the last micro-step only
            if self.amp_dtype is None:  # full precision: no context entered and left a micro-step
                loss = self.forward.loss_on(self.model, batch)
            else:
                with self.autocast():
                    loss = self.forward.loss_on(self.model, batch)
            if self.grad_accum > 1:
                loss = loss / self.grad_accum  # the mean over micro-steps (skipped for one: x / 1 is x, an op saved)
            if fetch_ahead or not last:
                self.data.prefetch()  # immediately fetch the next batch while the GPU runs the queued forward
            if last:  # the backward that waits for the other ranks' gradients is not this rank's own work
                self.own_s += _now() - self.own_from
                if not fetch_ahead and self.gpu_marks:
                    self.gpu_marks[1].record()
            (self.scaler.scale(loss) if self.scaling else loss).backward()
            # the spent graph kept until the next forward, as a plain loop's ``loss`` keeps it: the parameters'
            # gradient accumulators live on and are reused, not rebuilt and freed every step
            self.spent_graph = loss
            # stays on the device: no sync; the first micro-step's loss starts the sum (no zeros tensor a step)
            detached = loss.detach() if loss.dtype == torch.float32 else loss.detach().float()
            loss_sum = detached if loss_sum is None else loss_sum + detached
        assert loss_sum is not None  # grad_accum >= 1 (the schema checks it)
        self.own_from = _now()
        grad_norm = None
        if self.every.grad_clip > 0:
            if self.scaling:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.every.grad_clip)
        if self.scaling:
            self.scaler.step(self.optimizer)  # skips the step on inf/nan gradients
            self.scaler.update()
        else:
            self.optimizer.step()  # what the disabled scaler's step() calls
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return loss_sum, grad_norm

    def next_boundary(self, step: int) -> int:
        """The first step after ``step`` after which the loop logs, evaluates, saves or ends (no batch may then
        be waiting fetched ahead): worked out once per interval, not asked every step."""
        every = self.every
        ahead = [(step // every.log + 1) * every.log, max(every.end, step + 1)]
        if every.eval:
            ahead.append((step // every.eval + 1) * every.eval)
        save = self.checkpointer.next_due(step)
        return min(ahead) if save is None else min(save, *ahead)

    def fit(self) -> Dict[str, Any]:
        try:
            return self._fit()
        finally:
            self.heart.close()  # out of training, however it ended (the watchdog waits for it on an interrupt)

    def _fit(self) -> Dict[str, Any]:
        cfg, started = self.cfg, time.time()
        meter = Throughput(cfg.batch_size, tokens_per_sample(self.train_set[0]), self._flops_per_step(),
                           peak_flops(self.device, str(cfg.precision)), self.info.world_size, sync=self._sync)
        self.model.train()
        for hook in self.hooks:
            hook.on_start(self.step)
        self.logger.progress(step=self.step)
        loss_acc, interval = torch.zeros((), device=self.device), 0
        last: Dict[str, float] = {}
        every = self.every
        schedule = self.schedule
        beat = self.heart.slots  # the step stored here each step is all a watched rank pays
        beat[STEP] = beat[START] = self.step
        self.heart.phase(Phase.TRAIN)
        boundary = self.next_boundary(self.step)
        self.own_s, self.own_from = 0.0, _now()
        while self.step < every.end:
            if schedule and self.step in schedule:
                self.retune(schedule[self.step])
                every = self.every
            # one rank alone acts on a stop request at the next step; several agree on it one step later
            stop_asked = not self.distributed and self._stop_asked()
            if self.distributed and self.stop_flag.exchange(self._stop_asked()):
                self.data.put_back()  # the batch fetched ahead is trained after the resume
                if interval:
                    self._log_step(loss_acc / interval, None, meter, interval)
                self._stop()
            pause = stop_asked or self.step + 1 >= boundary
            loss, grad_norm = self.train_step(fetch_ahead=not pause)
            beat[STEP] = self.step
            loss_acc += loss
            interval += 1
            meter.step()
            if not pause:
                continue
            boundary = self.next_boundary(self.step)
            last_step = self.step >= every.end
            if self.step % every.log == 0 or last_step or stop_asked:
                last, stop = self._log_step(loss_acc / interval, grad_norm, meter, interval)
                loss_acc.zero_()
                interval = 0
                if stop and not last_step:
                    self._stop()
            if every.eval and self.step % every.eval == 0 and not last_step:
                with meter.paused():  # not training time: left out of tokens/s and MFU
                    self._eval(last)
                    reason = self._prune_reason(last)
                if reason:
                    return self._end(State.PRUNED, last, started, reason)
            if self.checkpointer.due(self.step):
                with meter.paused():
                    self._save()
            self.own_from = _now()  # a log step's, an eval's or a save's work is no step's own
        # a unit's end before max_steps: paused (checkpointed at exactly that step; the LR schedule still
        # spans max_steps, so the resumed run goes on as if it had never stopped)
        return self._end(State.COMPLETED if self.step >= every.max_steps else State.PAUSED, last, started)

    def _stop_asked(self) -> bool:
        for hook in self.hooks:  # a loop, not any() over a generator: two frames fewer a step
            if hook.should_stop(self.step):
                return True
        return False

    def _log_step(self, mean_loss: torch.Tensor, grad_norm: Optional[torch.Tensor],
                  meter: Throughput, steps: int) -> Tuple[Dict[str, float], bool]:
        """Log the interval's mean train loss (across ranks) and say whether any rank was asked to stop;
        with several ranks, each rank's own work per step rides along (one slot a rank) to be judged."""
        stop_asked = float(self._stop_asked())
        if self.judged:
            mine = [0.0] * self.info.world_size
            mine[self.info.rank] = self.gpu_own if self.gpu_marks else self.own_s / max(1, steps)
            packed = torch.cat([mean_loss.reshape(1), torch.tensor([stop_asked, *mine], device=self.device)])
        else:
            packed = torch.stack([mean_loss, torch.tensor(stop_asked, device=self.device)])
        self.own_s = 0.0
        if self.info.enabled:
            dist.all_reduce(packed)  # one collective on log steps only
            packed[0] /= self.info.world_size
        loss, stop, *own = packed.tolist()  # the interval's only host sync
        if self.gpu_marks:
            self.gpu_own = gpu_seconds(self.gpu_marks, self.gpu_own)
        if self.judge is not None:
            self._judge(own)
        values = {"train/loss": loss, "train/lr": self.scheduler.get_last_lr()[0], **meter.read()}
        self.nonfinite.check(self.step, loss, values["train/lr"])  # every rank holds the same reduced loss
        if grad_norm is not None:
            values["train/grad_norm"] = float(grad_norm)
        self.logger.scalars(values, self.step)
        self.logger.progress(step=self.step, metrics=values)
        return values, stop > 0

    def _judge(self, own: Sequence[float]) -> None:
        """Rank 0: the ranks' figures of this window judged; a newly flagged rank recorded, the summary's
        entries rewritten when they would read differently (hpctrain.job.straggler)."""
        assert self.judge is not None
        said = set(self.stragglers_shown)
        flagged = self.judge.window(self.step, own)
        shown = {s.rank: round(s.factor, 1) for s in flagged}
        if shown == self.stragglers_shown:
            return
        self.stragglers_shown = shown
        for s in flagged:
            if s.rank not in said:
                log.warning("%s (its own work per step %.4f s, the other ranks' median %.4f s, since step %d)",
                            s.line(), s.own_s, s.others_s, s.since)
                events.straggler(self.run_dir, s.rank, s.node, round(s.factor, 2), self.step, since=s.since,
                                 own_s=round(s.own_s, 6), others_s=round(s.others_s, 6))
        summary.write(self.run_dir, stragglers=[s.to_dict() for s in flagged])

    def _save(self, force: bool = False) -> None:
        self.heart.phase(Phase.CHECKPOINT)
        self.checkpointer.save(self.step, force=force)
        self.heart.phase(Phase.TRAIN)

    def _eval(self, last: Dict[str, float]) -> None:
        self.heart.phase(Phase.EVAL)
        if self.val_set is not None:
            self.model.eval()
            val = evaluate(self.raw_model, self.val_set, self.forward, self.metric_fns, self.micro_bs, self.info,
                           self.autocast, max_batches=int(self.cfg.eval_batches))
            self.model.train()
            last.update(val)
            self.logger.scalars(val, self.step)
        self.evaluated_at = self.step
        self.heart.phase(Phase.TRAIN)

    def _prune_reason(self, last: Dict[str, float]) -> Optional[str]:
        """The hooks' reason to end the run here as pruned (rank 0's answer counts), or None."""
        reasons = [r for r in (hook.on_eval(self.step, last) for hook in self.hooks) if r]
        if not self.info.enabled:
            return reasons[0] if reasons else None
        flag = torch.tensor([float(bool(reasons))], device=self.device)
        dist.broadcast(flag, 0)  # one small collective per eval: all ranks stop at the same step
        return (reasons[0] if reasons else "rank 0's hook") if flag.item() else None

    def _end(self, status: State, last: Dict[str, float], started: float, reason: str = "") -> Dict[str, Any]:
        """The one way a run ends: final eval, final checkpoint, the record's event, hparams, metrics.json."""
        self.stop_flag.drain()
        self.spent_graph = None
        if self.evaluated_at != self.step:
            self._eval(last)
        self._save(force=True)
        self.heart.close()
        self.data.close()
        cfg = self.cfg
        result = {"status": status.value, "step": self.step, "max_steps": cfg.max_steps, "metrics": last,
                  "objective": {"metric": cfg.objective.metric, "mode": cfg.objective.mode,
                                "value": last.get(cfg.objective.metric)},
                  "elapsed_s": time.time() - started}
        if status is State.PRUNED:
            log.info("pruned at step %d by %s (%s=%s)", self.step, reason, cfg.objective.metric,
                     last.get(cfg.objective.metric))
            result["pruned_at"] = self.step
            self.logger.scalars({"search/pruned": 1.0}, self.step)
            # the run's owner (job wrapper, search worker, run mode's app) hears it; a Trainer used on its own
            # (no owner) records it itself
            owner = lifecycle.current() or lifecycle.Lifecycle(self.run_dir, rank=self.info.rank)
            owner.end(lifecycle.Outcome.PRUNED, step=self.step, reason=reason)
        # completed, paused: the owner records it (the job wrapper knows the app, the worker the unit)
        self.logger.finish(hparams.run_summaries(cfg, last, self.run_dir))
        self.logger.progress(**result)
        self.logger.close()
        for hook in self.hooks:  # last: a signal during the final eval and save must not requeue a finished run
            hook.on_end(self.step, status)
        return result

    def _stop(self) -> None:
        """Asked to stop (preemption, time limit): checkpoint, then the hooks hand the job over."""
        log.warning("preemption/timeout signal: checkpointing at step %d, then requeue", self.step)
        self.stop_flag.drain()
        self.spent_graph = None
        self._save(force=True)
        self.heart.close()
        self.data.close()
        self.logger.progress(step=self.step)  # the job's checkpoint() records the requeue
        self.logger.close()
        for hook in self.hooks:
            hook.on_stop(self.step)
        raise RuntimeError(f"step {self.step}: a hook asked to stop, but none handed the job over")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _flops_per_step(self) -> Optional[float]:
        per_sample = getattr(self.raw_model, "flops_per_sample", None)
        return None if per_sample is None else per_sample() * self.cfg.batch_size


def device_marks(device: torch.device) -> Optional[Tuple[Any, Any]]:
    """Two timing CUDA events on a GPU (its own work on a window's last step); None elsewhere (the host's clock)."""
    if device.type != "cuda":
        return None
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def gpu_seconds(marks: Tuple[Any, Any], before: float) -> float:
    """The device time between the two events, once both are done (after the log step's sync); ``before``
    while they are not (a stop request's log step before any window's last step)."""
    try:
        return float(marks[0].elapsed_time(marks[1])) / 1000.0
    except RuntimeError:
        return before


def unit_end(hooks: Sequence[TrainerHook], max_steps: int) -> int:
    """The step this run stops at: the earliest of the hooks' ``end_step()`` (a search unit's), else max_steps."""
    ends = [e for e in (getattr(h, "end_step", lambda: None)() for h in hooks) if e is not None]
    return min([max_steps, *(int(e) for e in ends)])


def error_tail(exc: BaseException, lines: int = 15) -> str:
    text = "".join(traceback.format_exception(exc))
    return "\n".join(text.rstrip().splitlines()[-lines:])
