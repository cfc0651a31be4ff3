"""Rank-0 loggers (TensorBoard and metrics.json), throughput and MFU.

Non-zero ranks get a no-op logger, so the training loop never branches on the rank.
"""

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from hpctrain._compat import tensorboard as tb_compat
from hpctrain.core import paths as runfiles
from hpctrain.core import summary
from hpctrain.train.peaks import peak_flops_for

log = logging.getLogger(__name__)
EVENT_TIME = re.compile(r"^events\.out\.tfevents\.(\d+)\.")
MAX_ORDER_WAIT_S = 3.0  # waiting longer than this means the clocks disagree: said, not waited for
PROGRESS_EVERY_S = 5.0  # at most one progress line this often: a fast run does not flood its log


def peak_flops(device: torch.device, precision: str = "bf16") -> Optional[float]:
    """This GPU's dense peak for ``precision`` (hpctrain.train.peaks); None on CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), precision)


def after_older_event_files(tb_dir: Path, clock: Callable[[], float] = time.time,
                            sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until this writer's file sorts after the run's older ones. TensorBoard reads a run's files in
    name order (the second they were opened, then host and pid); a resumed writer's purge marker read
    before the older file it supersedes drops the newer steps (units of a search start a second apart)."""
    try:
        newest = max((int(m.group(1)) for p in tb_dir.iterdir() if (m := EVENT_TIME.match(p.name))), default=None)
    except OSError:
        return  # no tb dir yet: nothing to sort after
    if newest is None or clock() >= newest + 1:
        return
    wait = newest + 1 - clock()
    if wait > MAX_ORDER_WAIT_S:
        log.warning("this host's clock is %.0f s behind the host that wrote %s last: TensorBoard may show "
                    "this run's resumed curve out of order", wait, tb_dir)
        return
    sleep(wait)


class NullLogger:
    """What non-zero ranks log with: nothing."""

    def scalars(self, values: Dict[str, float], step: int) -> None:
        pass

    def progress(self, **fields: Any) -> None:
        pass

    def start(self, summaries: List[Any]) -> None:
        pass

    def finish(self, summaries: List[Any]) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressLine:
    """``step 120/400 (30%)  loss 0.4132  lr 0.0029  8.3 steps/s  ETA 34s``: a line on log steps, at most one
    every ``every_s`` (the first and the last always), to the ``hpctrain`` logger: the run's hpctrain.log,
    the console of a run in the foreground, the job's log on Slurm. A slow run and a stuck one look different."""

    def __init__(self, max_steps: int, every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_steps, self.every_s, self.clock = max_steps, every_s, clock
        self._last: Optional[float] = None  # when the last line was written
        self._since: Optional[tuple] = None  # (time, step) of the last line: the rate is measured from it

    def line(self, step: int, metrics: Dict[str, float]) -> Optional[str]:
        """The line to write now, or None (too soon after the last one)."""
        now = self.clock()
        last_step = step >= self.max_steps
        if self._last is not None and now - self._last < self.every_s and not last_step:
            return None
        parts = [f"step {step}/{self.max_steps} ({100 * step // max(1, self.max_steps)}%)"]
        if "train/loss" in metrics:
            parts.append(f"loss {metrics['train/loss']:.4g}")
        if "train/lr" in metrics:
            parts.append(f"lr {metrics['train/lr']:.3g}")
        if self._since is not None and step > self._since[1] and now > self._since[0]:
            rate = (step - self._since[1]) / (now - self._since[0])
            parts.append(f"{rate:.3g} steps/s")
            if not last_step:
                parts.append(f"ETA {_duration((self.max_steps - step) / rate)}")
        self._last, self._since = now, (now, step)
        return "  ".join(parts)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class RunLogger(NullLogger):
    """TensorBoard scalars in ``<run_dir>/tb``, progress in ``<run_dir>/metrics.json`` and a progress line."""

    def __init__(self, run_dir: Path, start_step: int, layout: Optional[Dict[str, Any]] = None,
                 max_steps: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.line = ProgressLine(max_steps) if max_steps > 0 else None
        if start_step:
            after_older_event_files(self.run_dir / runfiles.TB_DIR)
        # purge_step: after a requeue, events past the checkpoint are dropped (no doubled stretch of curve);
        # those at its own step were written before it was saved (a paused trial's rung eval): they stay
        self.writer = SummaryWriter(str(self.run_dir / runfiles.TB_DIR), purge_step=start_step + 1 if start_step else None)
        if layout:
            self.writer.add_custom_scalars(layout)  # the Custom Scalars tab: the objective and losses first

    def scalars(self, values: Dict[str, float], step: int) -> None:
        """The step's scalars as one event (what ``add_scalar`` writes, a value each; TensorBoard reads them
        alike): one record, and one pure-Python CRC over it, a log step instead of one per tag."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()])
        tb_compat.file_writer(self.writer).add_summary(summary, step)

    def progress(self, **fields: Any) -> None:
        summary.write(self.run_dir, **fields)  # the status is the run record's, where there is one
        metrics, step = fields.get("metrics"), fields.get("step")
        if self.line is not None and isinstance(metrics, dict) and isinstance(step, int):
            text = self.line.line(step, metrics)
            if text:
                log.info("%s", text)

    def start(self, summaries: List[Any]) -> None:
        """Write the HParams session start (``hparams.start_summaries``) at step 0."""
        self.finish(summaries)

    def finish(self, summaries: List[Any]) -> None:
        """Write the run's HParams summaries (``hparams.summaries``; the metrics are scalars already logged)."""
        file_writer = tb_compat.file_writer(self.writer)
        for item in summaries:
            file_writer.add_summary(item)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Throughput:
    """Samples/s (and tokens/s) over the steps since the last read; MFU on CUDA.

    Time that is not training is left out: the first ``warmup_steps`` steps (``torch.compile`` compiles
    on the first one), and whatever runs inside ``with meter.paused():`` (eval, checkpoints).
    """

    def __init__(self, samples_per_step: int, tokens_per_sample: int, flops_per_step: Optional[float],
                 peak: Optional[float], world_size: int, warmup_steps: int = 1,
                 sync: Callable[[], None] = lambda: None) -> None:
        self.samples_per_step = samples_per_step
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_step = flops_per_step
        self.peak = peak
        self.world_size = world_size
        self.warmup_left = warmup_steps
        self.sync = sync  # waits for the device: a boundary of the measured time (a host sync)
        self._t = time.perf_counter()
        self._steps = 0
        self._excluded = 0.0

    def step(self) -> None:
        if self.warmup_left > 0:
            self.warmup_left -= 1
            if self.warmup_left == 0:
                self.sync()  # once: the compile step's device work stays out of the first interval
                self._t, self._excluded = time.perf_counter(), 0.0
            return
        self._steps += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is not counted (it ends with a host sync anyway: eval's .item(), a save)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - start

    def read(self) -> Dict[str, float]:
        now = time.perf_counter()
        dt, steps = now - self._t - self._excluded, self._steps
        self._t, self._steps, self._excluded = now, 0, 0.0
        if steps == 0 or dt <= 0:
            return {}
        out = {"perf/samples_per_s": steps * self.samples_per_step / dt, "perf/step_time_s": dt / steps}
        if self.tokens_per_sample > 1:
            out["perf/tokens_per_s"] = out["perf/samples_per_s"] * self.tokens_per_sample
        if self.flops_per_step and self.peak:
            out["perf/mfu"] = self.flops_per_step * steps / dt / (self.peak * self.world_size)
        return out
