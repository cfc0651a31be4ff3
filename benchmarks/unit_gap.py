"""The gap between one search worker's units, measured on this machine (issue 21 (c) without the cluster).

    .venv/bin/python benchmarks/unit_gap.py                      # 4 local workers, 32 trials, seed 0
    .venv/bin/python benchmarks/unit_gap.py --seed 1             # the README's figures: seeds 0, 1, 2
    .venv/bin/python benchmarks/unit_gap.py --workers 1 --trials 8 --keep /tmp/gap-sweep

Runs the promotion-ASHA study of ``benchmarks/schedulers.py`` (its ``common()``, ``task()`` and ``asha()``
overrides: hpctrain's trainer on its classification set, TPE, 32 trials, rungs 30, 90, 180) with
``hydra/launcher=local`` (``hydra.launcher.max_parallel`` = the workers) instead of Slurm, then reads the
runs' records exactly as ``schedulers.units()`` does: a unit is a ``started`` event up to the trial's next
``paused``/``completed``/``pruned``/``failed`` (or ``started``) event; the gap is from one unit's end to the
same worker's next ``started``. Prints the mean unit length, the mean gap (and its median) and the share of
each worker's span in units (mean over workers, lowest), with the load average before and after. Run from
the repository root.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import schedulers  # noqa: E402  (benchmarks/schedulers.py: the study's overrides, units())
import search as base  # noqa: E402  (benchmarks/search.py: busy_share())

ROOT = Path(__file__).resolve().parents[1]


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=180)
    p.add_argument("--min-steps", type=int, default=30)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--keep", type=Path, default=None, help="the sweep dir to use (kept); default: a temporary one")
    args = p.parse_args()
    print(f"load average before: {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hpctrain-unit-gap-") as d:
        sweep = args.keep or Path(d) / "sweep"
        cmd = [sys.executable, "-m", "hpctrain", "-m", "hydra/sweeper=search", "hydra/launcher=local",
               f"hydra.sweep.dir={sweep}", f"hydra.launcher.max_parallel={args.workers}",
               *schedulers.common(args, args.seed), *schedulers.asha(args)]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=d, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)), capture_output=True, text=True)
        took = time.time() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        by_worker = schedulers.units(sweep)
    lengths = [e - s for v in by_worker.values() for s, e in v]
    gaps = [b[0] - a[1] for v in by_worker.values() for a, b in zip(sorted(v), sorted(v)[1:])]
    shares = [base.busy_share(spans, 1)[0] for spans in by_worker.values()]
    print(f"study: {args.trials} trials, {len(by_worker)} workers, {len(lengths)} units, {took:.1f} s")
    print(f"load average after: {load()}")
    print(f"units: mean {statistics.mean(lengths):.3f} s; gap between a worker's units: mean "
          f"{statistics.mean(gaps):.3f} s, median {statistics.median(gaps):.3f} s, max {max(gaps):.3f} s")
    print(f"share of each worker's span in units: mean {100 * statistics.mean(shares):.1f} %, "
          f"lowest {100 * min(shares):.1f} %")


if __name__ == "__main__":
    main()
