"""Rank-0 loggers (TensorBoard and metrics.json), throughput and MFU.

Non-zero ranks get a no-op logger, so the training loop never branches on the rank.
"""

import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from hpctrain import compat, record, runfiles

# Dense bf16 peak FLOP/s by device name (vendor data sheets; torchtitan uses the same figures).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
    "V100": 125e12,
    "L4": 121e12,
    "T4": 65e12,
}


def peak_flops(device: torch.device) -> Optional[float]:
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device))


def peak_flops_for(device_name: str) -> Optional[float]:
    """``"NVIDIA H100 80GB HBM3"`` -> 989e12; None for a device not in the table (no MFU then)."""
    for key, value in PEAK_FLOPS.items():
        if key in device_name:
            return value
    return None


class NullLogger:
    """What non-zero ranks log with: nothing."""

    def scalars(self, values: Dict[str, float], step: int) -> None:
        pass

    def progress(self, **fields: Any) -> None:
        pass

    def finish(self, hparams: Dict[str, Any], final: Dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger(NullLogger):
    """TensorBoard scalars in ``<run_dir>/tb`` and progress in ``<run_dir>/metrics.json``."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        # purge_step: after a requeue, events past the checkpoint are dropped, so the same
        # TensorBoard run continues without a doubled stretch of curve.
        self.writer = SummaryWriter(str(self.run_dir / runfiles.TB_DIR), purge_step=start_step or None)

    def scalars(self, values: Dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def progress(self, **fields: Any) -> None:
        record.write_summary(self.run_dir, **fields)  # the status is the run record's, where there is one

    def finish(self, hparams: Dict[str, Any], final: Dict[str, float]) -> None:
        """Write the run's hyperparameters with its final metrics (TensorBoard's HParams view)."""
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        exp, ssi, sei = hparams_summary(hparams, final)
        file_writer = compat.file_writer(self.writer)
        for summary in (exp, ssi, sei):
            file_writer.add_summary(summary)
        step = int(final.get("step", 0))
        for tag, value in final.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Throughput:
    """Samples/s (and tokens/s) over the steps since the last call; MFU on CUDA."""

    def __init__(self, samples_per_step: int, tokens_per_sample: int, flops_per_step: Optional[float],
                 peak: Optional[float], world_size: int) -> None:
        self.samples_per_step = samples_per_step
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_step = flops_per_step
        self.peak = peak
        self.world_size = world_size
        self._t = time.perf_counter()
        self._steps = 0

    def step(self) -> None:
        self._steps += 1

    def read(self) -> Dict[str, float]:
        now = time.perf_counter()
        dt, steps = now - self._t, self._steps
        self._t, self._steps = now, 0
        if steps == 0 or dt <= 0:
            return {}
        out = {"perf/samples_per_s": steps * self.samples_per_step / dt, "perf/step_time_s": dt / steps}
        if self.tokens_per_sample > 1:
            out["perf/tokens_per_s"] = out["perf/samples_per_s"] * self.tokens_per_sample
        if self.flops_per_step and self.peak:
            out["perf/mfu"] = self.flops_per_step * steps / dt / (self.peak * self.world_size)
        return out
