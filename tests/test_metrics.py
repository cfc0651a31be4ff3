"""Throughput and MFU arithmetic, and the peak table (MFU itself is only reported on CUDA)."""

import time

import pytest
import torch

from hpctrain.train.distributed import allow_tf32
from hpctrain.train.loggers import Throughput
from hpctrain.train.models.gpt import GPT
from hpctrain.train.peaks import peak_flops_for


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


def test_throughput_and_mfu_against_wall_time():
    """The rates against the test's own clock, not the meter's own dt."""
    t0 = time.perf_counter()
    meter = Throughput(samples_per_step=64, tokens_per_sample=128, flops_per_step=1e12, peak=1e14, world_size=2,
                       warmup_steps=0)
    for _ in range(4):
        time.sleep(0.05)
        meter.step()
    out = meter.read()  # the interval ends here: the trainer reads on its log step
    wall = time.perf_counter() - t0
    assert out["perf/samples_per_s"] == pytest.approx(4 * 64 / wall, rel=0.15), (out, wall)
    assert out["perf/tokens_per_s"] == pytest.approx(4 * 64 * 128 / wall, rel=0.15)
    assert out["perf/step_time_s"] == pytest.approx(wall / 4, rel=0.15)
    # MFU: 4 steps of 1e12 FLOPs in `wall` seconds over 2 GPUs of 1e14 each
    assert out["perf/mfu"] == pytest.approx(4e12 / wall / 2e14, rel=0.15)
    assert meter.read() == {}  # nothing since the last read


def test_gpt_flops_match_an_independent_count():
    """The 6N + attention estimate against torch's FlopCounterMode on one forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = GPT(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128)
    idx = torch.randint(256, (1, 64))
    # the math backend: attention as plain matmuls, which the counter sees (it skips CPU flash attention)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    # 6N counts LayerNorm and bias parameters too (no matmul): within 2 %
    assert model.flops_per_sample() == pytest.approx(counter.get_total_flops(), rel=0.02)
