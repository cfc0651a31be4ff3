"""Throughput and MFU arithmetic, and the peak table (MFU itself is only reported on CUDA)."""

import time

import pytest
import torch

from hpctrain.distributed import allow_tf32
from hpctrain.metrics import Throughput
from hpctrain.models.gpt import GPT
from hpctrain.peaks import peak_flops_for


@pytest.mark.parametrize("name,bf16,fp32", [
    # names as torch.cuda.get_device_name prints them
    ("NVIDIA H200", 989.4e12, 494.7e12),
    ("NVIDIA H200 NVL", 835e12, 417.5e12),
    ("NVIDIA H100 80GB HBM3", 989.4e12, 494.7e12),
    ("NVIDIA H100 PCIe", 756e12, 378e12),
    ("NVIDIA H100 NVL", 835e12, 417.5e12),
    ("NVIDIA H800", 989.4e12, 494.7e12),
    ("NVIDIA H800 PCIe", 756e12, 378e12),
    ("NVIDIA GH200 480GB", 989.4e12, 494.7e12),
    ("NVIDIA B200", 2250e12, 1125e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 156e12),
    ("NVIDIA A100 80GB PCIe", 312e12, 156e12),
    ("NVIDIA A10", 125e12, 62.5e12),
    ("NVIDIA A10G", 70e12, 35e12),
    ("NVIDIA L40S", 362e12, 183e12),
    ("NVIDIA L40", 181e12, 90.5e12),
    ("NVIDIA L4", 121e12, 60e12),
    ("Tesla V100-SXM2-32GB", None, 15.7e12),  # no bf16 tensor cores, no TF32
    ("Tesla V100-PCIE-16GB", None, 14e12),
    ("Tesla V100S-PCIE-32GB", None, 16.4e12),
    ("Tesla T4", None, 8.1e12),
    ("Some Future GPU", None, None),
    ("NVIDIA H20", None, None),
])
def test_peak_table_by_exact_model_and_variant(name, bf16, fp32):
    assert peak_flops_for(name, "bf16") == bf16
    assert peak_flops_for(name, "32") == fp32


def test_fp16_peaks_of_gpus_without_bf16():
    assert peak_flops_for("Tesla V100-SXM2-16GB", "fp16") == 125e12
    assert peak_flops_for("Tesla T4", "fp16") == 65e12
    assert peak_flops_for("NVIDIA H100 80GB HBM3", "fp16") == 989.4e12


def test_tf32_is_enabled_on_cuda_only():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        allow_tf32(torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "highest"
        allow_tf32(torch.device("cuda", 0))  # a device object needs no GPU
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_throughput_leaves_out_the_first_step_and_paused_time():
    syncs = []
    meter = Throughput(samples_per_step=10, tokens_per_sample=1, flops_per_step=None, peak=None, world_size=1,
                       sync=lambda: syncs.append(1))
    time.sleep(0.3)  # the first step: compile
    meter.step()
    assert syncs == [1]
    for _ in range(5):
        time.sleep(0.02)
        meter.step()
    with meter.paused():
        time.sleep(0.3)  # eval or a checkpoint
    out = meter.read()
    assert 0.02 <= out["perf/step_time_s"] < 0.06, out  # neither the 0.3 s compile nor the 0.3 s pause
    assert syncs == [1]  # no other host sync


def test_throughput_and_mfu():
    meter = Throughput(samples_per_step=64, tokens_per_sample=128, flops_per_step=1e12, peak=1e14, world_size=2,
                       warmup_steps=0)
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
