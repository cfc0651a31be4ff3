"""Dense peak FLOP/s per GPU model and precision, for MFU. A pure table: no torch, no CUDA.

Figures are the vendor data sheets' dense (no 2:4 sparsity) tensor-core peaks. ``precision=32`` runs
matmuls on TF32 tensor cores where the GPU has them (hpctrain enables TF32, as nanoGPT and torchtitan
do), so its peak is the TF32 one; V100 and T4 have no TF32 and no bf16 tensor cores: their ``32`` peak
is plain FP32 and they have no bf16 peak (bf16 runs there emulated; MFU would mean nothing).

A device name is matched by exact model token and variant, never by substring: ``NVIDIA L40`` is not
``L4``, ``H100 PCIe`` and ``H100 NVL`` are not the SXM part, ``A10G`` is not ``A10``.
"""

import re
from typing import Dict, NamedTuple, Optional, Tuple


class Peak(NamedTuple):
    fp32: Optional[float]  # what precision=32 runs at: TF32 tensor cores, or plain FP32 without them
    bf16: Optional[float]
    fp16: Optional[float]


_H100_SXM = Peak(494.7e12, 989.4e12, 989.4e12)
_H100_PCIE = Peak(378e12, 756e12, 756e12)
_H100_NVL = Peak(417.5e12, 835e12, 835e12)  # per GPU of the NVL pair
_A100 = Peak(156e12, 312e12, 312e12)  # SXM and PCIe alike

# (model token, variant) -> peak; variant "" is the SXM / only form. A model absent here has no MFU.
PEAKS: Dict[Tuple[str, str], Peak] = {
    ("B200", ""): Peak(1125e12, 2250e12, 2250e12),
    ("H200", ""): _H100_SXM,
    ("H200", "NVL"): _H100_NVL,
    ("GH200", ""): _H100_SXM,
    ("H100", ""): _H100_SXM,
    ("H100", "PCIE"): _H100_PCIE,
    ("H100", "NVL"): _H100_NVL,
    ("H800", ""): _H100_SXM,  # H100 compute, export interconnect
    ("H800", "PCIE"): _H100_PCIE,
    ("A100", ""): _A100,
    ("A800", ""): _A100,
    ("A10", ""): Peak(62.5e12, 125e12, 125e12),
    # AWS's A10G has no NVIDIA data sheet; 70 TFLOP/s bf16 dense is the figure cloud providers cite
    # (about half the A10's tensor rate). Unverified here: benchmarks/gpu_check.py measures it.
    ("A10G", ""): Peak(35e12, 70e12, 70e12),
    ("L40S", ""): Peak(183e12, 362e12, 362e12),
    ("L40", ""): Peak(90.5e12, 181e12, 181e12),
    ("L4", ""): Peak(60e12, 121e12, 121e12),
    # Volta/Turing: FP16 tensor cores only, no TF32, no bf16
    ("V100", ""): Peak(15.7e12, None, 125e12),  # SXM2
    ("V100", "PCIE"): Peak(14e12, None, 112e12),
    ("V100S", ""): Peak(16.4e12, None, 130e12),
    ("T4", ""): Peak(8.1e12, None, 65e12),
}
_MODELS = {model for model, _ in PEAKS}
_VARIANTS = ("NVL", "PCIE")


def parse_device_name(name: str) -> Tuple[Optional[str], str]:
    """``"NVIDIA H100 PCIe"`` -> ("H100", "PCIE"); ``"Tesla V100-SXM2-32GB"`` -> ("V100", "")."""
    tokens = [t for t in re.split(r"[\s\-_/]+", name.upper()) if t]
    model = next((t for t in tokens if t in _MODELS), None)
    variant = next((v for v in _VARIANTS if v in tokens), "")
    return model, variant


def peak_flops_for(device_name: str, precision: str = "bf16") -> Optional[float]:
    """Dense peak FLOP/s of one GPU for ``precision`` (32, bf16, fp16); None when unknown."""
    model, variant = parse_device_name(device_name)
    if model is None:
        return None
    peak = PEAKS.get((model, variant)) or PEAKS.get((model, ""))
    field = {"32": "fp32", "bf16": "bf16", "fp16": "fp16"}[str(precision)]
    return getattr(peak, field) if peak else None
