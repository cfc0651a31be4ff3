"""hpctrain's Trainer against a plain hand-written PyTorch loop: same model, data, optimizer, steps.

Both do the same work (per step: forward, backward, grad clipping, AdamW, LR schedule, a loss read on
log steps; at the end: a validation pass and a checkpoint); hpctrain also writes TensorBoard and
metrics.json, shards the data through a DataLoader and keeps its resumable state, which count against it. Runs are interleaved (plain, hpctrain, plain, ...) so that machine noise hits both alike.
The last line printed is the median time-per-step ratio hpctrain / plain (target: <= 1.03 on CPU).

    python benchmarks/trainer_overhead.py [--steps 300] [--repeats 7]

Wall-clock ratios swing with the load of a shared machine; instruction counts do not. ``--instructions``
runs each side in a fresh process under ``valgrind --tool=cachegrind --cache-sim=no`` at two step counts on
a small fixed workload (MLP 64-128-128-10, batch 64, AdamW, ``OMP_NUM_THREADS=1`` and one torch thread on
both sides) and prints the per-step instruction ratio (I_trainer(N2) - I_trainer(N1)) / (I_plain(N2) -
I_plain(N1)), once per repeat. The trainer side is what a job runs: ``Trainer.fit()`` with the preemption
hook, TensorBoard scalars and metrics.json every ``log_every`` steps, the utilisation sampler beside it.
The sampler wakes by the clock (valgrind slows the program ~50x, so it would wake ~50x more often per
step, and more so the more loaded the machine): its thread runs beside the trainer but sleeps through the
run, and its instructions per sample (measured apart) are added at the rate the jobs' interval gives at the
step's real (unslowed) speed.

    python benchmarks/trainer_overhead.py --instructions [--n1 50 --n2 250] [--repeats 2]
"""

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch.nn import functional as F

from hpctrain.job.sampler import Sampler
from hpctrain.train.build import build_data, build_model, build_optimizer
from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer, lr_lambda

OVERRIDES = ["model.hidden=512", "model.depth=3", "data.num_features=128", "batch_size=256", "log_every=50",
             "eval_every=0", "ckpt_every=0"]


SMALL = ["model.hidden=128", "model.depth=2", "data.num_features=64", "data.num_classes=10", "batch_size=64",
         "log_every=50", "eval_every=0", "ckpt_every=0"]  # --instructions: MLP 64-128-128-10


def compose(steps: int, overrides: List[str] = OVERRIDES):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from hpctrain.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides) + [f"max_steps={steps}"])


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
    # plain numbers, as a hand-written loop has them (a DictConfig read costs microseconds a step)
    steps, batch_size, grad_clip, log_every = int(cfg.max_steps), int(cfg.batch_size), float(cfg.grad_clip), int(cfg.log_every)
    start = time.perf_counter()
    for step in range(steps):
        if pos + batch_size > len(perm):
            perm, pos = torch.randperm(len(data), generator=g), 0
        idx = perm[pos : pos + batch_size]
        pos += batch_size
        x, y = data.x[idx], data.y[idx]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if (step + 1) % log_every == 0:
            loss.item()
    with torch.no_grad():  # the same final validation pass as the trainer's (20 micro-batches)
        val = splits.val
        for i in range(0, min(len(val), 20 * cfg.batch_size), cfg.batch_size):
            F.cross_entropy(model(val.x[i : i + cfg.batch_size]), val.y[i : i + cfg.batch_size]).item()
    with tempfile.TemporaryDirectory() as ckpt_dir:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": cfg.max_steps},
                   Path(ckpt_dir) / "last.pt")
    return (time.perf_counter() - start) / cfg.max_steps


def hpctrain_loop(cfg, sample_every_s: float = 0.0, out: Optional[Dict[str, float]] = None) -> float:
    """hpctrain's Trainer, with the job wrapper's utilisation sampler beside it when ``sample_every_s``;
    ``out`` is told how many samples the sampler took."""
    from hpctrain.job import heartbeat, watchdog
    from hpctrain.job.preemption import PreemptionGuard

    with tempfile.TemporaryDirectory() as run_dir:
        # as the job wrapper does: the attempt's heartbeat dir in the environment, the watchdog process started
        # (its own process: valgrind does not follow its exec, as it costs a job's training process nothing)
        beats = heartbeat.dir_for(run_dir, f"bench-{os.getpid()}")
        settings = watchdog.settings_of(cfg, beats, Path(run_dir), f"bench-{os.getpid()}")
        assert settings is not None, "hang_timeout_s=0: the watchdog is off"
        dog = watchdog.start(settings)
        os.environ[heartbeat.DIR_ENV] = str(beats)
        try:
            trainer = Trainer(cfg, Path(run_dir), DistInfo(), hooks=[PreemptionGuard()])  # as app.train builds it
            assert isinstance(trainer.heart, heartbeat.Heart), "the heartbeat is not on"
            sampler = Sampler(run_dir, interval_s=sample_every_s) if sample_every_s else None
            start = time.perf_counter()
            with sampler or contextlib.nullcontext():
                trainer.fit()
        finally:
            os.environ.pop(heartbeat.DIR_ENV, None)
            watchdog.stop(dog)
        if out is not None:
            out["samples"] = max(sampler.stats.n.values(), default=0) if sampler else 0
        return (time.perf_counter() - start) / cfg.max_steps


# ---------------------------------------------------------------- --instructions (cachegrind)
JOB_SAMPLE_EVERY_S = 5.0  # the job wrapper's interval (hpctrain.job.wrapper.SAMPLE_EVERY_S)
# under valgrind the sampler's thread runs but takes no clock-driven sample (valgrind's slowness, which moves
# with the machine's load, let in 12-52 of them a run: taking them out again left a load-dependent error);
# its cost at the jobs' interval at the step's real speed is added from its own measure per sample
SAMPLER_ASLEEP_S = 1e6
PINNED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}  # same work in every run


SAMPLER_WORKER = """
import sys, tempfile, psutil
from hpctrain.job.sampler import Sampler, _Gpus
with tempfile.TemporaryDirectory() as run_dir:
    s = Sampler(run_dir)
    process, gpus = psutil.Process(), _Gpus()
    process.cpu_percent(None)
    for _ in range(int(sys.argv[1])):
        s.sample(process, gpus)
    s._writer.close()
print("WORKER {}")
"""  # the sampler's own cost per sample (TensorBoard scalars included), apart from any clock; no torch


def worker(side: str, steps: int, config: str) -> None:
    """One side in this process (under valgrind, started by :func:`instructions`); a JSON line at the end.
    The config was composed once outside (Hydra's compose costs billions of instructions under valgrind)."""
    from omegaconf import OmegaConf

    torch.set_num_threads(1)
    cfg = OmegaConf.load(config)
    cfg.max_steps = steps
    out: Dict[str, float] = {}
    out["step_s"] = plain_loop(cfg) if side == "plain" else hpctrain_loop(cfg, SAMPLER_ASLEEP_S, out)
    print("WORKER " + json.dumps(out), flush=True)


def counted(side: str, steps: int, tmp: Path) -> Dict[str, float]:
    """Instructions of one fresh process running ``side`` for ``steps`` (all its threads), and its JSON line."""
    out_file = tmp / f"cg.{side}.{steps}.out"
    own = ["-c", SAMPLER_WORKER, str(steps)] if side == "sampler" else \
        [os.path.abspath(__file__), "--worker", side, "--steps", str(steps), "--config", str(tmp / "config.yaml")]
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out_file}", sys.executable,
           *own]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **PINNED}, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("WORKER ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    total = re.search(r"^summary:\s+(\d+)", out_file.read_text(), re.M)
    assert total is not None, out_file
    return {"ir": float(total[1]), **json.loads(lines[-1][len("WORKER "):]), "out_file": str(out_file)}


def instructions(n1: int, n2: int, repeats: int, keep: str = "", parallel: int = 2) -> None:
    if n2 <= n1:
        sys.exit("--n2 must be larger than --n1")
    from concurrent.futures import ThreadPoolExecutor

    from omegaconf import OmegaConf

    ratios = []
    with tempfile.TemporaryDirectory(prefix="cachegrind-") as name:
        tmps, step_s = [Path(keep or name) / f"repeat{rep}" for rep in range(repeats)], []
        for tmp in tmps:
            tmp.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(compose(n2, SMALL), tmp / "config.yaml", resolve=True)
            # the step's real speed, for the sampler's share at the jobs' interval (a small term: read unslowed)
            step_s.append(json.loads(subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--worker", "trainer", "--steps", str(n2), "--config",
                 str(tmp / "config.yaml")], capture_output=True, text=True, env={**os.environ, **PINNED},
                check=True).stdout.split("WORKER ")[-1])["step_s"])
        sides = [("sampler", 5), ("sampler", 25), ("plain", n1), ("plain", n2), ("trainer", n1), ("trainer", n2)]
        jobs = [(tmp, side, steps) for tmp in tmps for side, steps in sides]
        # counts do not depend on what else runs: the repeats' runs share one pool of `parallel` processes
        with ThreadPoolExecutor(parallel) as pool:
            counts = list(pool.map(lambda job: counted(job[1], job[2], job[0]), jobs))
    for rep in range(repeats):
        s1, s2, *runs = counts[rep * len(sides):(rep + 1) * len(sides)]
        per_sample = (s2["ir"] - s1["ir"]) / 20
        plain, ours = runs[:2], runs[2:]
        # the samples valgrind's slowness let in, out; the jobs' rate at the real step time, in
        ours_ir = [r["ir"] - r["samples"] * per_sample for r in ours]
        sampler_per_step = per_sample * step_s[rep] / JOB_SAMPLE_EVERY_S
        per_plain = (plain[1]["ir"] - plain[0]["ir"]) / (n2 - n1)
        per_ours = (ours_ir[1] - ours_ir[0]) / (n2 - n1) + sampler_per_step
        ratios.append(per_ours / per_plain)
        print(f"repeat {rep}: plain {per_plain / 1e6:.4f} M instructions/step, trainer {per_ours / 1e6:.4f} M "
              f"(+{(per_ours - per_plain) / 1e3:.1f} k; sampler: {per_sample / 1e3:.0f} k a sample, samples in the "
              f"runs {ours[0]['samples']:.0f}/{ours[1]['samples']:.0f} counted apart, {sampler_per_step:.0f} a step "
              f"at {step_s[rep] * 1e3:.1f} ms/step and one sample per {JOB_SAMPLE_EVERY_S:g} s), "
              f"ratio {ratios[-1]:.4f}", flush=True)
    spread = (max(ratios) - min(ratios)) / min(ratios)
    print(f"torch {torch.__version__}, steps {n1} and {n2}, {repeats} repeats, {' '.join(f'{k}={v}' for k, v in PINNED.items())}; "
          f"spread {spread * 100:.2f} % run to run")
    print(f"per-step instruction ratio trainer/plain: {statistics.median(ratios):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=None, help="default: 7; with --instructions 2")
    parser.add_argument("--sample-every-s", type=float, default=0.5,
                        help="the utilisation sampler's interval beside hpctrain's run (0: off; jobs use 5 s)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under cachegrind instead of timing (repeats to 0.5 %%)")
    parser.add_argument("--n1", type=int, default=50)
    parser.add_argument("--n2", type=int, default=250)
    parser.add_argument("--keep", default="", help="--instructions: keep cachegrind's files in this directory")
    parser.add_argument("--parallel", type=int, default=2, help="--instructions: valgrind processes at a time")
    parser.add_argument("--worker", choices=("plain", "trainer"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.config)
    if args.instructions:
        return instructions(args.n1, args.n2, args.repeats or 2, args.keep, args.parallel)
    args.repeats = args.repeats or 7
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
