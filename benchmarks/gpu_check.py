"""One-shot check of the GPU path: run it the moment a GPU is lent (under 8 minutes on one H100/H200).

    python benchmarks/gpu_check.py --out DIR          # on the GPU machine
    python benchmarks/gpu_check.py --cpu-smoke --out DIR   # tiny sizes on CPU: the script itself works

Writes DIR/gpu_check.json (every figure) and DIR/gpu_check.md (the table for benchmarks/README.md), and
prints the table. Sections, each recorded even when another fails:
  environment  driver, torch, CUDA, NCCL, device name -> peak FLOP/s, gcc, TF32 flags, flash SDPA (bf16)
  defects      what one GPU can show of issue 10: torch.compile with the image's compiler, device choice and
               one GPU per rank, this device's RNG state through a weights_only checkpoint, TF32 on/off
               matmul speed, NCCL teardown after a failure does not block
  gpt124m      a ~124M GPT (12 layers, 768 wide, sequence 1024), bf16, 60 steps through hpctrain's
               Trainer.train_step: compile time, steady tokens/s, MFU, peak memory; with and without
               vocab padding (50257 -> 50304) and compile
  precision    fp16 (GradScaler) and bf16 runs of a small GPT through Trainer.fit: finite loss, scale
  resume       a compiled run checkpointed, then resumed from its checkpoint by a new Trainer
  host_syncs   host syncs in non-log steps, counted by torch.cuda.set_sync_debug_mode("warn")
The last line printed is the MFU of the 124M GPT, bf16, compiled, padded (target >= 0.45 on H100/H200).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpctrain.train import checkpointer as checkpoint
from hpctrain.train.distributed import DistInfo, allow_tf32, device_index, pick_device, teardown  # noqa: E402
from hpctrain.train.loggers import peak_flops  # noqa: E402
from hpctrain.train.peaks import peak_flops_for  # noqa: E402

# the sizes of a run on one GPU, and the tiny ones of --cpu-smoke
SIZES = {
    "gpu": {"big": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab=50257, batch=16, steps=60, warmup=10),
            "small": dict(n_layer=4, n_head=4, n_embd=256, seq_len=256, vocab=50257, batch=32, steps=50),
            "matmul": 8192},
    "cpu": {"big": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab=1000, batch=4, steps=6, warmup=2),
            "small": dict(n_layer=1, n_head=2, n_embd=32, seq_len=32, vocab=128, batch=8, steps=8),
            "matmul": 256},
}
BUDGET_S = 7.5 * 60  # sections not started by then are skipped (the device lease is short)


def uniform_tokens(vocab_size: int, seq_len: int, train_size: int, val_size: int, seed: int = 0, **_: Any):
    """Uniformly random tokens (the built-in Markov data set draws a permutation per token of a 50257 vocabulary:
    minutes). The loss stays near log(vocab): a throughput run measures no denormal arithmetic."""
    from hpctrain.train.datasets.synthetic import Splits, TensorData

    g = torch.Generator().manual_seed(seed)

    def draw(n: int) -> TensorData:
        seq = torch.randint(vocab_size, (n, seq_len + 1), generator=g)
        return TensorData(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    return Splits(draw(train_size), draw(val_size))


def compose(overrides: List[str]):
    """hpctrain's config; the loss computed inside the model (loss=model) where the config has it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from hpctrain.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        try:
            return hydra_compose(config_name="config", overrides=overrides + ["loss=model"])
        except Exception:  # noqa: BLE001 - an hpctrain without the loss group: the trainer's own loss
            return hydra_compose(config_name="config", overrides=overrides)


def gpt_overrides(size: Dict[str, int], device: torch.device, precision: str, compile_: bool, pad: int,
                  steps: int, ckpt_every: int = 0) -> List[str]:
    b = size["batch"]
    return [
        "model=gpt", "data=tokens", f"data._target_={__name__}.uniform_tokens", f"model.n_layer={size['n_layer']}", f"model.n_head={size['n_head']}",
        f"model.n_embd={size['n_embd']}", f"model.vocab_pad_to={pad}", f"data.vocab_size={size['vocab']}",
        f"data.seq_len={size['seq_len']}", f"data.train_size={b * (steps + 2)}", f"data.val_size={b}",
        f"batch_size={b}", f"max_steps={steps}", f"precision={precision}", f"compile={str(compile_).lower()}",
        f"log_every={steps}", "eval_every=0", f"ckpt_every={ckpt_every}", f"device={device.type}", "num_workers=0",
    ]


def trainer_for(overrides: List[str], run_dir: Path, device: torch.device):
    from hpctrain.train.trainer import Trainer

    torch._dynamo.reset()  # each variant compiles afresh: its compile time is its own
    return Trainer(compose(overrides), run_dir, DistInfo(device=device))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------ sections
def environment(device: torch.device, _: Dict[str, Any], __: Path) -> Dict[str, Any]:
    out: Dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "python": sys.version.split()[0]}
    gcc = shutil.which("gcc")
    out["gcc"] = (subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines() or ["?"])[0] \
        if gcc else None
    if device.type == "cuda":
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        out["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        name = torch.cuda.get_device_name(device)
        out["device"] = name
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        out["peak_tflops"] = {p: (peak_flops_for(name, p) or 0) / 1e12 or None for p in ("32", "bf16", "fp16")}
    else:
        out["device"] = "cpu"
    out["tf32_before"] = {"matmul_precision": torch.get_float32_matmul_precision(),
                          "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    allow_tf32(device)
    out["tf32_after_hpctrain"] = {"matmul_precision": torch.get_float32_matmul_precision(),
                                  "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(1, 12, 1024, 64, device=device, dtype=torch.bfloat16)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        out["flash_sdpa_bf16"] = True
    except Exception as exc:  # noqa: BLE001 - the answer is "no", with the reason
        out["flash_sdpa_bf16"] = f"no: {str(exc).splitlines()[0][:200]}"
    return out


def defects(device: torch.device, sizes: Dict[str, Any], smoke: bool) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    # 1. torch.compile needs a C compiler at run time (Triton's launcher, Inductor's C++ on CPU)
    if smoke:
        out["compile_a_function"] = "skipped in --cpu-smoke"
    else:
        t = time.perf_counter()
        f = torch.compile(lambda x: torch.sin(x) * 2 + x)
        x = torch.randn(1024, device=device)
        out["compile_a_function"] = bool(torch.allclose(f(x), torch.sin(x) * 2 + x, atol=1e-5))
        out["compile_a_function_s"] = round(time.perf_counter() - t, 1)
    # 2./3. device choice, and two ranks never on one GPU
    out["auto_device"] = str(pick_device("auto", 0, 1))
    out["device_count"] = torch.cuda.device_count()
    try:
        device_index(1, 2, 1, {"CUDA_VISIBLE_DEVICES": "0"})
        out["two_ranks_one_gpu_refused"] = False
    except RuntimeError:
        out["two_ranks_one_gpu_refused"] = True
    # 5. this device's RNG state through a weights_only checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rng.pt"
        torch.save({"rng": checkpoint.rng_state(device), "step": 0}, path)
        first = torch.rand(4, device=device)
        checkpoint.set_rng_state(torch.load(path, weights_only=True)["rng"], device)
        out["rng_restored_on_device"] = bool(torch.equal(first, torch.rand(4, device=device)))
        out["rng_has_cuda_state"] = "cuda" in checkpoint.rng_state(device)
    # 6. fp32 matmul without and with TF32
    n = sizes["matmul"]
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for mode in ("highest", "high"):
        torch.set_float32_matmul_precision(mode)
        a @ b
        sync(device)
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        out[f"fp32_matmul_tflops_{mode}"] = round(10 * 2 * n ** 3 / (time.perf_counter() - t) / 1e12, 2)
    allow_tf32(device)
    return out


def gpt124m(device: torch.device, sizes: Dict[str, Any], smoke: bool, tmp: Path) -> Dict[str, Any]:
    size = sizes["big"]
    variants = [(True, 64), (True, 1), (False, 64)]
    out: Dict[str, Any] = {}
    for compile_, pad in variants:
        label = f"{'compiled' if compile_ else 'eager'}, {'padded' if pad > 1 else 'unpadded'}"
        compile_ = compile_ and not smoke  # compiling on a shared CPU takes minutes: the smoke run checks the script
        trainer = trainer_for(gpt_overrides(size, device, "bf16", compile_, pad, size["steps"]),
                              tmp / label.replace(", ", "_"), device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        trainer.train_step(fetch_ahead=True)  # compiles (when compile=true)
        sync(device)
        first_s = time.perf_counter() - t
        for _ in range(size["warmup"] - 1):
            trainer.train_step(fetch_ahead=True)
        sync(device)
        t = time.perf_counter()
        timed = size["steps"] - size["warmup"]
        for _ in range(timed):
            loss, _ = trainer.train_step(fetch_ahead=True)
        sync(device)
        dt = time.perf_counter() - t
        flops = trainer._flops_per_step() * timed
        peak = peak_flops(device, "bf16")
        out[label] = {
            "compile": compile_, "vocab": trainer.raw_model.tok_emb.num_embeddings,
            "params_m": round(sum(p.numel() for p in trainer.raw_model.parameters()) / 1e6, 1),
            "first_step_s": round(first_s, 1), "step_ms": round(1000 * dt / timed, 1),
            "tokens_per_s": round(timed * size["batch"] * size["seq_len"] / dt),
            "mfu": round(flops / dt / peak, 3) if peak else None,
            "peak_mem_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 1) if device.type == "cuda" else None,
            "loss": round(float(loss) / 1, 3), "loss_inside_model": "model" in str(OmegaConf.select(trainer.cfg, "loss._target_", default="")),
        }
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def precision(device: torch.device, sizes: Dict[str, Any], smoke: bool, tmp: Path) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    size = sizes["small"]
    for prec in ("bf16", "fp16"):
        trainer = trainer_for(gpt_overrides(size, device, prec, False, 64, size["steps"]), tmp / prec, device)
        scale_before = trainer.scaler.get_scale() if trainer.scaler.is_enabled() else None
        result = trainer.fit()
        loss = result["metrics"].get("train/loss")
        out[prec] = {"loss": loss, "finite": loss is not None and loss == loss and abs(loss) != float("inf"),
                     "scaler": trainer.scaler.is_enabled(), "scale_start": scale_before,
                     "scale_end": trainer.scaler.get_scale() if trainer.scaler.is_enabled() else None,
                     # optimizer steps since the scale last changed: every step counted when none was skipped
                     "scaler_good_steps": trainer.scaler._get_growth_tracker() if trainer.scaler.is_enabled() else None,
                     "steps": result["step"]}
    return out


def resume(device: torch.device, sizes: Dict[str, Any], smoke: bool, tmp: Path) -> Dict[str, Any]:
    size, run_dir = sizes["small"], tmp / "resume"
    compile_ = not smoke
    first = trainer_for(gpt_overrides(size, device, "bf16", compile_, 64, 20, ckpt_every=10), run_dir, device)
    first.fit()
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    second = trainer_for(gpt_overrides(size, device, "bf16", compile_, 64, 30, ckpt_every=10), run_dir, device)
    resumed_at = second.step
    result = second.fit()
    return {"compile": compile_, "saved_step": saved["step"], "resumed_at": resumed_at, "final_step": result["step"],
            "rng_entries": len(saved["rng"]), "cuda_rng_saved": "cuda" in saved["rng"][0],
            "previous_kept": (run_dir / "checkpoints" / "previous.pt").exists(),
            "loss": result["metrics"].get("train/loss"),
            "ok": saved["step"] == 20 and resumed_at == 20 and result["step"] == 30}


def host_syncs(device: torch.device, sizes: Dict[str, Any], smoke: bool, tmp: Path) -> Dict[str, Any]:
    if device.type != "cuda":
        return {"syncs_per_step": "n/a on CPU"}
    size = sizes["small"]
    out: Dict[str, Any] = {}
    for prec, compile_ in (("bf16", True), ("fp16", False)):  # fp16: the GradScaler's syncs, compiled or not
        trainer = trainer_for(gpt_overrides(size, device, prec, compile_, 64, 20), tmp / f"sync_{prec}", device)
        for _ in range(3):
            trainer.train_step(fetch_ahead=True)  # compile and warm up first
        sync(device)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(5):
                    trainer.train_step(fetch_ahead=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        messages = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
        out[prec] = {"compile": compile_, "syncs_in_5_steps": len(messages), "first": messages[:3]}
    return out


def nccl_teardown(device: torch.device, sizes: Dict[str, Any], smoke: bool, tmp: Path) -> Dict[str, Any]:
    """Issue 10 item 7 on one GPU: the failure path's teardown returns (abort, no finalize)."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp / 'pg'}", rank=0, world_size=1,
                            device_id=device if device.type == "cuda" else None)
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    start = time.perf_counter()
    teardown(failed=True)
    return {"backend": backend, "teardown_after_failure_s": round(time.perf_counter() - start, 2),
            "left_initialized": dist.is_initialized()}


SECTIONS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "environment": lambda d, s, smoke, tmp: environment(d, s, tmp),
    "defects": lambda d, s, smoke, tmp: defects(d, s, smoke),
    "gpt124m": gpt124m, "precision": precision, "resume": resume, "host_syncs": host_syncs,
    "nccl_teardown": nccl_teardown,
}


def markdown(results: Dict[str, Any]) -> str:
    lines = ["| section | item | value |", "|---|---|---|"]

    def walk(section: str, prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(section, f"{prefix}{k}.", v)
        else:
            lines.append(f"| {section} | {prefix.rstrip('.')} | {value} |")

    for section, value in results.items():
        walk(section, "", value)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: checks the script runs")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run these sections only")
    args = parser.parse_args()

    if args.cpu_smoke:
        device, sizes = torch.device("cpu"), SIZES["cpu"]
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: torch sees no CUDA device (use --cpu-smoke to check the script on CPU)")
        device, sizes = torch.device("cuda", 0), SIZES["gpu"]
        torch.cuda.set_device(device)
    started = time.perf_counter()
    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, section in SECTIONS.items():
            if args.only and name not in args.only:
                continue
            if time.perf_counter() - started > BUDGET_S:
                results[name] = {"skipped": f"time budget of {BUDGET_S:.0f} s used up"}
                continue
            t = time.perf_counter()
            try:
                results[name] = section(device, sizes, args.cpu_smoke, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - record it and go on: one lease, every figure we can get
                results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
            results[name]["section_s"] = round(time.perf_counter() - t, 1)
            print(f"gpu_check: {name} done in {results[name]['section_s']} s", file=sys.stderr, flush=True)
    results["total_s"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    table = markdown(results)
    (args.out / "gpu_check.md").write_text(table + "\n")
    print(table)
    mfu = results.get("gpt124m", {}).get("compiled, padded", {}).get("mfu")
    print(f"MFU, 124M GPT, bf16, compiled, vocab padded: {mfu}")


if __name__ == "__main__":
    main()
