"""The job's utilisation sampler: CPU and memory (psutil), GPUs through NVML, into TensorBoard and metrics.json."""

import json
import sys
import time
import types

from cli_helpers import hpctrain_env, run_hpctrain, tb_scalars

from hpctrain.job.sampler import Sampler


def _fake_nvml(util: int, used_gb: float) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=int(used_gb * 1024 ** 3))
    return nvml


def test_samples_cpu_memory_and_the_visible_gpu_into_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(12, 3.0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # one of the two: sampled alone
    with Sampler(str(tmp_path), interval_s=0.05) as sampler:
        deadline = time.time() + 5
        while sampler.stats.n.get("cpu", 0) < 4 and time.time() < deadline:
            sum(i * i for i in range(20000))  # something to measure
    out = sampler.summary()
    assert out["samples"] >= 4 and out["gpu_util_mean"] == 12.0 and out["gpu_mem_peak_gb"] == 3.0
    assert out["rss_peak_gb"] > 0 and out["cpu_peak"] >= 0
    assert tb_scalars(tmp_path, "sys/gpu_util")[:2] == [12.0, 12.0]
    assert len(tb_scalars(tmp_path, "sys/rss")) == out["samples"]


def test_a_run_keeps_its_means_and_peaks_and_status_flags_idle_gpus(tmp_path):
    helpers = tmp_path / "fake"
    helpers.mkdir()
    (helpers / "pynvml.py").write_text(
        "import types\nnvmlInit = lambda: None\nnvmlDeviceGetCount = lambda: 1\n"
        "nvmlDeviceGetHandleByIndex = lambda i: i\nnvmlDeviceGetUUID = lambda h: 'GPU-0'\n"
        "nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=9)\n"
        "nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 * 1024 ** 3)\n")
    env = {"PYTHONPATH": str(helpers), "HPCTRAIN_SAMPLE_EVERY_S": "0.1"}
    sweep = tmp_path / "s"
    run_hpctrain(["-m", "lr=1e-3", "max_steps=300", "log_every=50", "eval_every=150", "hydra/launcher=local",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=env)
    run_dir = next(p for p in sweep.iterdir() if p.name.startswith("0_"))
    sampled = json.loads((run_dir / "metrics.json").read_text())["sys"]
    assert sampled["gpu_util_mean"] == 9.0 and sampled["samples"] >= 1 and sampled["rss_peak_gb"] > 0
    assert tb_scalars(run_dir, "sys/gpu_util")
    import subprocess

    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep)], capture_output=True,
                            text=True, env=hpctrain_env(env), cwd=tmp_path)
    assert "#0: GPUs 9 % busy on average, peak memory 2.0 GB" in status.stdout, status.stdout


def test_sys_scalars_are_at_the_training_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "metrics.json").write_text(json.dumps({"step": 40}))
    with Sampler(str(tmp_path), interval_s=0.05) as sampler:
        deadline = time.time() + 5
        while sampler.stats.n.get("cpu", 0) < 2 and time.time() < deadline:
            time.sleep(0.01)
        (tmp_path / "metrics.json").write_text(json.dumps({"step": 70}))
        while sampler.stats.n.get("cpu", 0) < 5 and time.time() < deadline:
            time.sleep(0.01)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("sys/cpu")]
    assert steps[0] == 40 and steps[-1] == 70 and steps == sorted(steps), steps
