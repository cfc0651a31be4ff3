"""Schedulers on the Slurm test cluster: promotion ASHA against no pruning and against pruner=asha, and how
much of the workers' time goes into training units.

    python benchmarks/schedulers.py --part a --seeds 0 1 2   # (a) best objective and steps: scheduler=asha,
                                                             #     pruner=none, pruner=asha (scheduler=none)
    python benchmarks/schedulers.py --part c                 # (c) 4 workers: share of worker time in units;
                                                             #     login command time (array queued, held)
    options: --trials N (32) --max-steps N (180) --min-steps N (30) --eta N (3) --workers N (4)

(a) is the task of benchmarks/search.py (b) (hpctrain's trainer on its classification set, lr in
tag(log, interval(1e-4, 1)), TPE, 32 trials, 4 workers) with a longer budget (``--max-steps`` 180, three
times search.py's 60; eval every 10). The first rung is one epoch (30 steps of 64 of the 2,048 training
samples: Syne Tune's default grace period is one epoch), eta 3 (its default reduction factor): rungs 30, 90,
180. Per seed it also prints, from the ``none`` study's own curves, how well the value at the first rung
ranks the trials' final values (Spearman), and the final value of the trial best at that rung. "steps" is the sum
of the steps every trial ran (each trial's metrics.json ``step``: where it ended, paused, pruned or completed).
(c) reads the runs' records: a unit is a ``started`` event of a worker up to the trial's next ``paused``,
``completed`` or ``pruned`` event; a worker's span is its first unit's start to its last unit's end.
Every figure is printed; the last line of each part is its headline. Run from the repository root.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search as base  # noqa: E402  (benchmarks/search.py: submitting, waiting, reading the study)

ENDS = ("paused", "completed", "pruned", "failed")


def task(args: argparse.Namespace) -> List[str]:
    return [f"max_steps={args.max_steps}", "eval_every=10", "log_every=10", "ckpt_every=0",
            "data.train_size=2048", "data.val_size=256", "model.hidden=32", "batch_size=64"]


def common(args: argparse.Namespace, seed: int) -> List[str]:
    return base.SPACE + task(args) + ["hydra.sweeper.sampler=tpe", f"hydra.sweeper.seed={seed}",
                                      f"hydra.sweeper.n_trials={args.trials}", f"hydra.sweeper.n_workers={args.workers}"]


def asha(args: argparse.Namespace) -> List[str]:
    return ["hydra.sweeper.scheduler=asha", f"hydra.sweeper.eta={args.eta}", f"hydra.sweeper.min_steps={args.min_steps}"]


def spearman(xs: List[float], ys: List[float]) -> float:
    def ranks(v: List[float]) -> List[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def first_rung_check(sweep: Path, rung: int, label: str) -> None:
    """From a ``none`` study (every trial run to the end, its value reported at each eval): does the value
    at the first rung rank the final values? The trial best at the rung, and the rank of the best final."""
    done = [t for t in base.load_trials(sweep) if t.state.name == "COMPLETE" and rung in t.intermediate_values]
    if len(done) < 3:
        return
    at, final = [t.intermediate_values[rung] for t in done], [t.value for t in done]
    pick = min(range(len(done)), key=lambda i: at[i])
    best = min(range(len(done)), key=lambda i: final[i])
    rank_of_best = sorted(at).index(at[best]) + 1
    print(f"{label}: value at step {rung} vs final over {len(done)} trials: Spearman {spearman(at, final):.2f}; "
          f"the trial best at step {rung} ends at {final[pick]:.4f} (best final {final[best]:.4f}, "
          f"{rank_of_best}. at step {rung})", flush=True)


def completed_trials(sweep: Path) -> str:
    ts = [t for t in base.load_trials(sweep) if t.state.name == "COMPLETE"]
    return ", ".join(f"#{t.number} lr={t.params.get('lr', float('nan')):.4g} {t.value:.4f}" for t in ts)


def part_a(tmp: Path, args: argparse.Namespace) -> List[float]:
    configs = {"none": ["hydra.sweeper.pruner=none"], "scheduler=asha": asha(args),
               "pruner=asha": ["hydra.sweeper.pruner=asha"]}
    out: Dict[str, List[Tuple[int, float]]] = {k: [] for k in configs}
    shares: List[float] = []
    for seed in args.seeds:
        for name, extra in configs.items():
            sweep, _, _ = base.study(tmp, f"a-{name.replace('=', '-')}-{seed}", common(args, seed) + extra)
            out[name].append((base.steps_run(sweep), base.best(base.load_trials(sweep))))
            print(f"(a) seed {seed} {name}: {out[name][-1][0]} steps, best val/loss {out[name][-1][1]:.4f}", flush=True)
            if name == "none":
                first_rung_check(sweep, args.min_steps, f"(a) seed {seed} none")
            if name == "scheduler=asha":
                print(f"(a) seed {seed} scheduler=asha: completed {completed_trials(sweep)}", flush=True)
                shares.append(share(sweep, f"(a) seed {seed}"))
    base_steps = statistics.mean(s for s, _ in out["none"])
    base_best = statistics.mean(b for _, b in out["none"])
    for name in ("pruner=asha", "scheduler=asha"):
        steps = statistics.mean(s for s, _ in out[name])
        b = statistics.mean(v for _, v in out[name])
        print(f"(a) {name}: {100 * (1 - steps / base_steps):.0f} % fewer steps than none, best val/loss "
              f"{b:.4f} vs {base_best:.4f} ({100 * (b - base_best) / base_best:+.1f} %)")
    return shares


def units(sweep: Path) -> Dict[str, List[Tuple[float, float]]]:
    """Each worker's units: (start, end) times from the trials' records."""
    by_worker: Dict[str, List[Tuple[float, float]]] = {}
    for d in sweep.glob("trial-*"):
        evs = []
        for p in (d / ".hpctrain" / "record").glob("*.json"):
            kind = p.name.split(".")[1]
            if kind == "started" or kind in ENDS:
                evs.append((int(p.name.split(".")[0]) / 1e9, kind, p))
        evs.sort()
        for i, (t, kind, p) in enumerate(evs):
            if kind != "started":
                continue
            end = next((t2 for t2, k2, _ in evs[i + 1:] if k2 in ENDS or k2 == "started"), None)
            if end is not None:
                by_worker.setdefault(str(json.loads(p.read_text()).get("job_id")), []).append((t, end))
    return by_worker


def share(sweep: Path, label: str) -> float:
    by_worker = units(sweep)
    shares = []
    for spans in by_worker.values():
        busy, span = base.busy_share(spans, 1)
        shares.append(busy)
    mean = statistics.mean(shares) if shares else float("nan")
    lengths = [e - s for v in by_worker.values() for s, e in v]
    gaps = [b[0] - a[1] for v in by_worker.values() for a, b in zip(sorted(v), sorted(v)[1:])]
    print(f"{label}: {len(by_worker)} workers, {len(lengths)} units of {statistics.mean(lengths):.2f} s on average, "
          f"{statistics.mean(gaps) if gaps else 0:.2f} s between a worker's units; share of each worker's span in "
          f"units: mean {100 * mean:.1f} %, lowest {100 * min(shares):.1f} %", flush=True)
    return mean


def part_c(tmp: Path, args: argparse.Namespace, shares: List[float]) -> None:
    """``shares``: those of (a)'s scheduler=asha studies when (a) ran first (no study of its own then)."""
    if shares:
        mean = statistics.mean(shares)
    else:
        sweep, _, _ = base.study(tmp, "c-asha", common(args, 0) + asha(args))
        mean = share(sweep, "(c) scheduler=asha")
    times = []
    for i in range(3):  # three fresh sweeps: the median of three
        held = tmp / f"c-held-{i}"
        cmd = [sys.executable, "-m", "hpctrain", "-m", "hydra/sweeper=search", "hydra/launcher=slurm",
               f"hydra.sweep.dir={held}", *common(args, 0), *asha(args), "+hydra.launcher.additional_parameters.hold=true"]
        proc, took = base.run(cmd, tmp)
        if proc.returncode != 0:
            raise SystemExit(proc.stdout + proc.stderr)
        subprocess.run(["scancel", base.array_job(held)], capture_output=True)
        times.append(took)
    print(f"(c) login command gone after {', '.join(f'{t:.2f}' for t in times)} s (array queued, held)")
    print(f"(c) {args.workers} workers: {100 * mean:.1f} % of worker time in training units; login command gone "
          f"after {statistics.median(times):.2f} s (median of 3)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("a", "c"), action="append", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=180)
    p.add_argument("--min-steps", type=int, default=30)
    p.add_argument("--eta", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-sched-bench-") as d:
        shares: List[float] = []
        for part in sorted(args.part):
            if part == "a":
                shares = part_a(Path(d), args)
            else:
                part_c(Path(d), args, shares)


if __name__ == "__main__":
    main()
