"""Issue 21 (b): PBT against the best of as many constant-value trials, at the same total steps.

    python benchmarks/schedulers_pbt.py probe                      # does a schedule beat every constant here?
    python benchmarks/schedulers_pbt.py --seeds 0 1 2              # population 8 vs 8 constant trials
    python benchmarks/schedulers_pbt.py --seeds 0 1 2 --slurm-workers 4   # the same on the Slurm test cluster
    python benchmarks/schedulers_pbt.py --seeds 0 --task classification --steps 120 --interval 20   # the old task

The task (``--task``, default ``regression``): one of TASKS, always with a constant learning rate
(``min_lr_ratio=1``, no warmup), so a run's lr changes only if something changes it during training. Both
arms search ``lr`` in ``tag(log, interval(1e-3, 1))`` with the random sampler and the same seed (so the
same 8 first values): PBT (``scheduler=pbt``, ``population=8``, a decision every ``--interval`` steps)
against ``scheduler=none`` (8 trials at one constant lr each, no pruning). Every trial trains ``--steps``
steps in both arms: the same total. The figure per seed is the best trial's final ``val/loss``
(``--held-out``: also that trial's loss on the val samples no eval saw). Runs on
``hydra/launcher=local`` with one worker, or with ``--slurm-workers N`` on the Slurm test cluster (CPU-bound;
steps are counted, not timed). The last line is the
headline.

``probe`` trains single runs in this process (no search): a grid of constant lrs over the same range and
hand-made decays (a cosine, step decays through the trainer's ``schedule`` key), so the margin a schedule
can win on the task is known before the search arms run.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
LOW, HIGH = 1e-3, 1.0
SPACE = f"lr=tag(log,interval({LOW:g},{HIGH:g}))"
CONSTANT = ["warmup_steps=0", "min_lr_ratio=1.0"]
# Each task: overrides of hpctrain's built-in config (the lr schedule's keys aside).
TASKS: Dict[str, List[str]] = {
    # the first measurement's task: Gaussian classes, a small train set (overfits), a small val set (noisy)
    "classification": ["data.train_size=2048", "data.val_size=256", "model.hidden=32", "batch_size=64"],
    # sin(2 x.w) + noise 0.1 (a loss floor of 0.01), MSE, Adam on small batches: gradient noise sets a
    # floor that grows with the lr, so a high lr early and a low one late beats every constant
    "regression": ["data=regression", "data.train_size=8192", "data.val_size=1024", "model.hidden=64",
                   "batch_size=16", "optim.weight_decay=0.0"],
}


def task(name: str, steps: int, eval_every: int) -> List[str]:
    return [f"max_steps={steps}", f"eval_every={eval_every}", f"log_every={eval_every}",
            f"ckpt_every={eval_every}", *CONSTANT, *TASKS[name]]


# ---------------------------------------------------------------------------------------- probe
def single(overrides: Sequence[str], run_dir: Path) -> float:
    """One run in this process; its final val/loss."""
    from hydra import compose, initialize_config_module

    from hpctrain.schema import register_configs
    from hpctrain.train.distributed import DistInfo
    from hpctrain.train.trainer import Trainer

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    result = Trainer(cfg, run_dir, DistInfo()).fit()
    return float(result["metrics"]["val/loss"])


def decays(steps: int) -> List[Tuple[str, List[str]]]:
    """Hand-made schedules: cosines to 1 % of their peak, and step decays (x0.1 at 1/2 and again at 3/4)."""
    out = []
    for peak in (0.1, 0.03, 0.01):
        out.append((f"cosine {peak:g} -> {peak / 100:g}", [f"lr={peak}", "min_lr_ratio=0.01"]))
    for peak in (0.1, 0.03):
        sched = f"schedule=[{{step:{steps // 2},lr:{peak / 10:g}}},{{step:{3 * steps // 4},lr:{peak / 100:g}}}]"
        out.append((f"step {peak:g}/{peak / 10:g}/{peak / 100:g}", [f"lr={peak}", sched]))
    return out


def probe(name: str, steps: int, eval_every: int, n_const: int) -> None:
    base = task(name, steps, eval_every)
    grid = [LOW * (HIGH / LOW) ** (i / (n_const - 1)) for i in range(n_const)]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hpctrain-pbt-probe-") as tmp:
        const = []
        for i, lr in enumerate(grid):
            v = single(base + [f"lr={lr:.6g}"], Path(tmp) / f"c{i}")
            const.append(v)
            print(f"  constant lr {lr:.4g}: val/loss {v:.4f}", flush=True)
        made = []
        for j, (label, extra) in enumerate(decays(steps)):
            keys = {o.split("=", 1)[0] for o in extra}
            v = single([o for o in base if o.split("=", 1)[0] not in keys] + extra, Path(tmp) / f"d{j}")
            made.append(v)
            print(f"  {label}: val/loss {v:.4f}", flush=True)
    best_c = min(v for v in const if math.isfinite(v))
    best_d = min(v for v in made if math.isfinite(v))
    print(f"probe {name}, {steps} steps: best of {n_const} constant lrs (log grid {LOW:g}..{HIGH:g}) {best_c:.4f}, "
          f"best hand-made decay {best_d:.4f} ({100 * (best_c - best_d) / best_c:+.1f} %); {time.time() - started:.0f} s")


# ---------------------------------------------------------------------------------------- the arms
def arm(sweep: Path, scheduler: str, seed: int, name: str, steps: int, interval: int, eval_every: int,
        population: int, held: bool = False, workers: int = 0) -> Optional[float]:
    """``workers``: 0 runs the arm on ``hydra/launcher=local`` with one worker; N > 0 on the Slurm test
    cluster with N array workers (the command returns once queued; this waits for the array to end)."""
    extra = (["hydra.sweeper.scheduler=pbt", f"hydra.sweeper.population={population}",
              f"hydra.sweeper.interval={interval}"] if scheduler == "pbt" else ["hydra.sweeper.pruner=none"])
    launcher = ["hydra/launcher=slurm", f"hydra.sweeper.n_workers={workers}"] if workers else \
        ["hydra/launcher=local", "hydra.sweeper.n_workers=1"]
    cmd = [sys.executable, "-m", "hpctrain", "-m", "hydra/sweeper=search", *launcher,
           f"hydra.sweep.dir={sweep}", SPACE, "hydra.sweeper.sampler=random",
           f"hydra.sweeper.n_trials={population}", f"hydra.sweeper.seed={seed}",
           *extra, *task(name, steps, eval_every)]
    started = time.time()
    sweep.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, cwd=sweep.parent, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nexited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    if workers:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import search as base  # benchmarks/search.py: the array's job id, waiting for it

        base.wait_gone(base.array_job(sweep))
    values, by_dir = [], {}
    for d in sorted(sweep.glob("trial-*")):
        m = json.loads((d / "metrics.json").read_text())
        assert m.get("step") == steps, (d, m.get("step"))
        v = (m.get("metrics") or {}).get("val/loss")
        if isinstance(v, (int, float)) and math.isfinite(v):
            values.append(float(v))
            by_dir[d.name] = float(v)
    best = min(values) if values else None
    print(f"  {scheduler:>4} seed {seed}: {len(values)} trials x {steps} steps, best val/loss "
          f"{best if best is None else round(best, 4)} ({time.time() - started:.0f} s)", flush=True)
    if held:
        hv = held_out(sweep, name, steps, eval_every)
        print(f"       held-out val/loss of the best-by-val/loss trial "
              f"{hv[min(hv, key=lambda k: by_dir.get(k, math.inf))]:.4f} (best held-out of all {min(hv.values()):.4f})",
              flush=True)
    if scheduler == "pbt":
        print(f"       best member's schedule: {best_schedule(sweep)}", flush=True)
    return best


def held_out(sweep: Path, name: str, steps: int, eval_every: int) -> Dict[str, float]:
    """Each trial's final weights on the val samples its evals never saw (the trainer evaluates the first
    20 micro-batches only), by trial dir name: PBT selects on the evaluated ones, so this shows how much of
    its figure is selection."""
    import torch
    from hydra import compose, initialize_config_module

    from hpctrain.schema import register_configs
    from hpctrain.train.build import build_data, build_loss, build_model
    from hpctrain.train.forward import Forward

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=task(name, steps, eval_every))
    val = build_data(cfg.data).val
    used = min(len(val), 20 * int(cfg.batch_size))
    batch = val.__getitems__(list(range(used, len(val))))
    out = {}
    for d in sorted(sweep.glob("trial-*")):
        model = build_model(cfg.model)
        model.load_state_dict(torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"])
        forward = Forward(build_loss(cfg.loss), cfg.loss._target_, model)
        with torch.no_grad():
            out[d.name] = float(forward.loss_of(*forward(model, batch), batch))
    return out


def best_schedule(sweep: Path) -> str:
    """The best PBT member's lr over steps (its lineage through its donors), for the README."""
    from hpctrain.search import pbt

    lineages, values = {}, {}
    for d in sweep.glob("trial-*"):
        m = json.loads((d / "metrics.json").read_text())
        n = int(m.get("trial", d.name[6:9]))
        lineages[n] = m.get("lineage") or []
        v = (m.get("metrics") or {}).get("val/loss")
        if isinstance(v, (int, float)) and math.isfinite(v):
            values[n] = float(v)
    if not values:
        return "-"
    sched = pbt.schedule(min(values, key=values.get), lineages)
    return ", ".join(f"{e['step']}: {float(e['params'].get('lr', float('nan'))):.3g}" for e in sched)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=("arms", "probe"), default="arms")
    ap.add_argument("--task", choices=sorted(TASKS), default="regression")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--interval", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=None, help="default: the interval")
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--held-out", action="store_true", help="also each arm's best trial on unevaluated val samples")
    ap.add_argument("--slurm-workers", type=int, default=0,
                    help="run the arms on the Slurm test cluster with this many array workers (default: local, 1)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the sweep dirs under this dir (default: a temp dir)")
    args = ap.parse_args()
    eval_every = args.eval_every or args.interval
    if args.mode == "probe":
        probe(args.task, args.steps, eval_every, args.population)
        return
    pbt, const = [], []
    with tempfile.TemporaryDirectory(prefix="hpctrain-pbt-bench-") as tmp:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep.resolve())
        for seed in args.seeds:
            const.append(arm(Path(tmp) / f"none-{seed}", "none", seed, args.task, args.steps, args.interval,
                             eval_every, args.population, args.held_out, args.slurm_workers))
            pbt.append(arm(Path(tmp) / f"pbt-{seed}", "pbt", seed, args.task, args.steps, args.interval,
                           eval_every, args.population, args.held_out, args.slurm_workers))
    wins = sum(p is not None and c is not None and p < c for p, c in zip(pbt, const))
    print(f"best val/loss per seed: pbt {[v if v is None else round(v, 4) for v in pbt]}, "
          f"constant {[v if v is None else round(v, 4) for v in const]}")
    print(f"PBT (population {args.population}, interval {args.interval}) vs best of {args.population} constant-lr "
          f"trials, task {args.task}, {args.steps} steps each: mean best val/loss "
          f"{statistics.mean(v for v in pbt if v is not None):.4f} vs "
          f"{statistics.mean(v for v in const if v is not None):.4f}; PBT better in {wins}/{len(pbt)} seeds")


if __name__ == "__main__":
    main()
