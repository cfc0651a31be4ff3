"""hpctrain's Trainer against a plain hand-written PyTorch loop: same model, data, optimizer, steps.

Both do the same work (per step: forward, backward, grad clipping, AdamW, LR schedule, a loss read on
log steps; at the end: a validation pass and a checkpoint); hpctrain also writes TensorBoard and
metrics.json, shards the data through a DataLoader and keeps its resumable state, which count against it. Runs are interleaved (plain, hpctrain, plain, ...) so that machine noise hits both alike.
The last line printed is the median time-per-step ratio hpctrain / plain (target: <= 1.03 on CPU).

    python benchmarks/trainer_overhead.py [--steps 300] [--repeats 7]
"""

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from hpctrain.job.sampler import Sampler
from hpctrain.train.build import build_data, build_model, build_optimizer
from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer, lr_lambda

OVERRIDES = ["model.hidden=512", "model.depth=3", "data.num_features=128", "batch_size=256", "log_every=50",
             "eval_every=0", "ckpt_every=0"]


def compose(steps: int):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from hpctrain.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=OVERRIDES + [f"max_steps={steps}"])


def plain_loop(cfg) -> float:
    """What a researcher would write by hand for the same training."""
    torch.manual_seed(cfg.seed)
    splits = build_data(cfg.data)
    data = splits.train
    model = build_model(cfg.model)
    opt = build_optimizer(cfg.optim, model, cfg.lr, torch.device("cpu"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio))
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(data), generator=g)
    pos = 0
    start = time.perf_counter()
    for step in range(cfg.max_steps):
        if pos + cfg.batch_size > len(perm):
            perm, pos = torch.randperm(len(data), generator=g), 0
        idx = perm[pos : pos + cfg.batch_size]
        pos += cfg.batch_size
        x, y = data.x[idx], data.y[idx]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if (step + 1) % cfg.log_every == 0:
            loss.item()
    with torch.no_grad():  # the same final validation pass as the trainer's (20 micro-batches)
        val = splits.val
        for i in range(0, min(len(val), 20 * cfg.batch_size), cfg.batch_size):
            F.cross_entropy(model(val.x[i : i + cfg.batch_size]), val.y[i : i + cfg.batch_size]).item()
    with tempfile.TemporaryDirectory() as ckpt_dir:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": cfg.max_steps},
                   Path(ckpt_dir) / "last.pt")
    return (time.perf_counter() - start) / cfg.max_steps


def hpctrain_loop(cfg, sample_every_s: float = 0.0) -> float:
    """hpctrain's Trainer, with the job wrapper's utilisation sampler beside it when ``sample_every_s``."""
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), DistInfo())
        sampler = Sampler(run_dir, interval_s=sample_every_s) if sample_every_s else contextlib.nullcontext()
        start = time.perf_counter()
        with sampler:
            trainer.fit()
        return (time.perf_counter() - start) / cfg.max_steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sample-every-s", type=float, default=0.5,
                        help="the utilisation sampler's interval beside hpctrain's run (0: off; jobs use 5 s)")
    args = parser.parse_args()
    cfg = compose(args.steps)
    plain_loop(compose(20)), hpctrain_loop(compose(20))  # warm-up: allocator, TensorBoard import
    ratios = []
    for rep in range(args.repeats):
        plain, ours = plain_loop(cfg), hpctrain_loop(cfg, args.sample_every_s)
        ratios.append(ours / plain)
        print(f"repeat {rep}: plain {plain * 1e3:.2f} ms/step, hpctrain {ours * 1e3:.2f} ms/step, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    sampler = f"sampler every {args.sample_every_s:g} s" if args.sample_every_s else "sampler off"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps x {args.repeats} repeats, "
          f"{sampler}")
    print(f"median time-per-step ratio hpctrain/plain: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
