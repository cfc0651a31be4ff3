"""Throughput and MFU arithmetic, and the peak table (MFU itself is only reported on CUDA)."""

import time

from hpctrain.metrics import Throughput, peak_flops_for
from hpctrain.models.gpt import GPT


def test_peak_table():
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("Some Future GPU") is None


def test_throughput_and_mfu():
    meter = Throughput(samples_per_step=64, tokens_per_sample=128, flops_per_step=1e12, peak=1e14, world_size=2)
    for _ in range(4):
        meter.step()
    time.sleep(0.2)
    out = meter.read()
    dt = out["perf/step_time_s"] * 4
    assert abs(out["perf/samples_per_s"] - 4 * 64 / dt) < 1e-6
    assert abs(out["perf/tokens_per_s"] - 4 * 64 * 128 / dt) < 1e-3
    assert abs(out["perf/mfu"] - 4e12 / dt / 2e14) < 1e-9
    assert meter.read() == {}  # nothing since the last read


def test_gpt_flops_follow_the_6n_rule():
    model = GPT(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=64)
    n = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    assert model.flops_per_sample() == (6 * n + 12 * 2 * 64 * 32) * 32
