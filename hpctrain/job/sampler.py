"""Utilisation of a running job: each rank's GPU (NVML), the task's CPU and memory (psutil), every few seconds.

A daemon thread of the job wrapper, never the training step: it wakes every ``interval_s``, reads counters
the driver and the kernel keep anyway, and goes back to sleep. Rank 0 of each node writes TensorBoard
scalars (``sys/gpu_util``, ``sys/gpu_mem``, ``sys/cpu``, ``sys/rss``) into the run's ``tb/`` (an event file
of its own beside the trainer's), at the training step metrics.json holds and, at the end of the attempt, the means and peaks into metrics.json
(``"sys"``). Without NVML (no GPU, no driver, nvidia-ml-py missing) only CPU and memory are sampled.
"""

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hpctrain.core import summary as run_summary
from hpctrain.core.paths import TB_DIR
from hpctrain.job.hardware import visible_handles

GB = 1024 ** 3


@dataclass
class Stats:
    """Running means and peaks; ``summary()`` is what metrics.json keeps."""

    sums: Dict[str, float] = field(default_factory=dict)
    peaks: Dict[str, float] = field(default_factory=dict)
    n: Dict[str, int] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.n[name] = self.n.get(name, 0) + 1
        self.peaks[name] = max(self.peaks.get(name, value), value)

    def summary(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for name in self.sums:
            out[f"{name}_mean"] = round(self.sums[name] / self.n[name], 3)
            out[f"{name}_peak"] = round(self.peaks[name], 3)
        out["samples"] = max(self.n.values(), default=0)
        return out


class _Gpus:
    """NVML handles of the GPUs this process sees (CUDA_VISIBLE_DEVICES, as indexes or UUIDs); none without NVML."""

    def __init__(self) -> None:
        self.handles: List[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no driver, no library, no GPU: CPU and memory only
            return
        self.nvml = pynvml
        try:
            self.handles = visible_handles(pynvml, empty_is_all=True)
        except Exception:  # noqa: BLE001 - a half-working driver: nothing sampled
            pass

    def read(self) -> "Optional[tuple[float, float]]":
        """(mean utilisation %, memory used GB summed) over the visible GPUs, or None."""
        if not self.handles:
            return None
        try:
            util = [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            mem = [self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles]
        except Exception:  # noqa: BLE001 - a GPU lost mid-run (Xid): stop sampling it, say nothing here
            self.handles = []
            return None
        return sum(util) / len(util), sum(mem) / GB


class Sampler:
    """``with Sampler(run_dir, write_tb=rank == 0):`` around the task: samples until the block ends."""

    def __init__(self, run_dir: str, interval_s: float = 5.0, write_tb: bool = True) -> None:
        self.run_dir, self.interval_s, self.write_tb = run_dir, interval_s, write_tb
        self.stats = Stats()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._writer: Any = None
        self._step = 0

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, name="hpctrain-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        if self._writer is not None:
            self._writer.close()

    def _loop(self) -> None:
        import psutil

        process = psutil.Process()
        process.cpu_percent(None)  # the first call only starts the interval
        gpus = _Gpus()
        while not self._stop.wait(self.interval_s):
            try:
                self.sample(process, gpus)
            except Exception:  # noqa: BLE001 - sampling must never take the run down
                continue

    def sample(self, process: Any, gpus: Any) -> Dict[str, float]:
        # this process: the trainer and its threads (a packed run's child has a sampler of its own)
        values = {"cpu": process.cpu_percent(None), "rss": process.memory_info().rss / GB}
        gpu = gpus.read()
        if gpu is not None:
            values["gpu_util"], values["gpu_mem"] = gpu
        for name, value in values.items():
            self.stats.add(name, value)
        if self.write_tb:
            self._scalars(values)
        return values

    def _scalars(self, values: Dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        if self._writer is None:
            self._writer = EventFileWriter(os.path.join(self.run_dir, TB_DIR), filename_suffix=".sys")
        self._step = self._training_step()
        summary = Summary(value=[Summary.Value(tag=f"sys/{k}", simple_value=float(v)) for k, v in values.items()])
        self._writer.add_event(Event(wall_time=time.time(), step=self._step, summary=summary))
        self._writer.flush()

    def _training_step(self) -> int:
        """The step the trainer last wrote into metrics.json: sys/* share the x-axis of the losses."""
        step = (run_summary.read(self.run_dir) or {}).get("step")
        return step if isinstance(step, int) and step >= self._step else self._step

    def summary(self) -> Dict[str, float]:
        """Means and peaks: ``gpu_util_mean`` (%), ``gpu_mem_peak`` (GB), ``cpu_mean`` (%), ``rss_peak`` (GB), ..."""
        out = self.stats.summary()
        if "gpu_mem_peak" in out:
            out["gpu_mem_peak_gb"] = out["gpu_mem_peak"]
        if "rss_peak" in out:
            out["rss_peak_gb"] = out["rss_peak"]
        return out

