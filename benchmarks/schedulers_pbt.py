"""Issue 21 (b): PBT against the best of as many constant-value trials, at the same total steps.

    python benchmarks/schedulers_pbt.py --seeds 0 1 2            # population 8 vs 8 constant trials
    python benchmarks/schedulers_pbt.py --seeds 0 --steps 120    # a quicker look

The task: hpctrain's built-in classification set with a constant learning rate (``min_lr_ratio=1``,
no warmup), so a run can only decay its lr if something changes it during training. Both arms search
``lr`` in ``tag(log, interval(1e-3, 1))`` with the random sampler and the same seed: PBT
(``scheduler=pbt``, ``population=8``, an exploit/explore decision every ``interval`` steps) against
``scheduler=none`` (8 trials at one constant lr each, no pruning). Every trial trains ``--steps`` steps in
both arms, so the total is the same. The objective is each trial's final ``val/loss``; the figure per seed
is the best trial's. Runs on ``hydra/launcher=local`` (one worker: this is CPU-bound, and each arm's
steps are counted, not timed). The last line is the headline.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]


def task(steps: int, eval_every: int) -> List[str]:
    return [f"max_steps={steps}", f"eval_every={eval_every}", f"log_every={eval_every}", f"ckpt_every={eval_every}",
            "warmup_steps=0", "min_lr_ratio=1.0", "data.train_size=2048", "data.val_size=256", "model.hidden=32",
            "batch_size=64"]


def arm(sweep: Path, scheduler: str, seed: int, steps: int, interval: int, population: int) -> Optional[float]:
    extra = ([f"hydra.sweeper.scheduler=pbt", f"hydra.sweeper.population={population}",
              f"hydra.sweeper.interval={interval}"] if scheduler == "pbt" else ["hydra.sweeper.pruner=none"])
    cmd = [sys.executable, "-m", "hpctrain", "-m", "hydra/sweeper=search", "hydra/launcher=local",
           f"hydra.sweep.dir={sweep}", "lr=tag(log,interval(1e-3,1))", "hydra.sweeper.sampler=random",
           f"hydra.sweeper.n_trials={population}", "hydra.sweeper.n_workers=1", f"hydra.sweeper.seed={seed}",
           *extra, *task(steps, interval // 2 if interval % 2 == 0 else interval)]
    proc = subprocess.run(cmd, cwd=sweep.parent, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nexited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    values = []
    for d in sorted(sweep.glob("trial-*")):
        m = json.loads((d / "metrics.json").read_text())
        assert m.get("step") == steps, (d, m.get("step"))
        v = (m.get("metrics") or {}).get("val/loss")
        if isinstance(v, (int, float)):
            values.append(float(v))
    print(f"  {scheduler:>4} seed {seed}: {len(values)} trials x {steps} steps, best val/loss {min(values):.4f}",
          flush=True)
    return min(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--interval", type=int, default=40)
    ap.add_argument("--population", type=int, default=8)
    args = ap.parse_args()
    pbt, const = [], []
    with tempfile.TemporaryDirectory(prefix="hpctrain-pbt-bench-") as tmp:
        for seed in args.seeds:
            const.append(arm(Path(tmp) / f"none-{seed}", "none", seed, args.steps, args.interval, args.population))
            pbt.append(arm(Path(tmp) / f"pbt-{seed}", "pbt", seed, args.steps, args.interval, args.population))
    wins = sum(p < c for p, c in zip(pbt, const))
    print(f"best val/loss per seed: pbt {[round(v, 4) for v in pbt]}, constant {[round(v, 4) for v in const]}")
    print(f"PBT (population {args.population}, interval {args.interval}) vs best of {args.population} constant-lr "
          f"trials, {args.steps} steps each: mean best val/loss {statistics.mean(pbt):.4f} vs "
          f"{statistics.mean(const):.4f}; PBT better in {wins}/{len(pbt)} seeds")


if __name__ == "__main__":
    main()
