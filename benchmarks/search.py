"""hydra/sweeper=search on the Slurm test cluster: search quality, pruning savings, time to queued, slot use.

    python benchmarks/search.py --part c            # (c) command to queued, torch not imported
    python benchmarks/search.py --part d            # (d) slot use, hpctrain: 16 trials of 4-16 s, 4 workers
    python benchmarks/search.py --part d --hydra-python /tmp/hos/bin/python   # (d) the same with Hydra's
                                                    #     Optuna sweeper over hydra-submitit-launcher
    python benchmarks/search.py --part a --seeds 0 1 2   # (a) best objective, TPE against random
    python benchmarks/search.py --part b --seeds 0 1 2   # (b) training steps and best objective per pruner

(a) and (b) run hpctrain's own trainer on its classification set, whose validation loss depends smoothly
on log(lr): 32 trials, 4 workers, lr in tag(log, interval(1e-4, 1)). Every figure is printed; the last
line of each part is its headline. Run from the repository root with the project's venv.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
TASK = ["max_steps=60", "eval_every=10", "log_every=10", "ckpt_every=0", "data.train_size=2048",
        "data.val_size=256", "model.hidden=32", "batch_size=64"]
SPACE = ["lr=tag(log,interval(1e-4,1))"]


def run(cmd: List[str], cwd: Path, timeout: float = 3600) -> Tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.time() - t0


def array_job(sweep: Path) -> str:
    return json.loads((sweep / "sweep.json").read_text())["submissions"][-1]["job_ids"][0]


def wait_gone(job: str, timeout: float = 3600) -> None:
    end = time.time() + timeout
    while time.time() < end:
        out = subprocess.run(["squeue", "-h", "-r", "-j", job], capture_output=True, text=True).stdout
        if not out.strip():
            return
        time.sleep(2)
    raise SystemExit(f"job {job} still queued after {timeout} s")


def load_trials(sweep: Path) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(sweep / ".hpctrain" / "study.journal")))
    return optuna.load_study(study_name="search", storage=storage).get_trials(deepcopy=False)


def study(tmp: Path, name: str, extra: List[str], app: Optional[List[str]] = None) -> Tuple[Path, float, str]:
    """Submit one search on Slurm, wait for its workers to end; (sweep dir, seconds to return, stdout)."""
    sweep = tmp / name
    cmd = (app or [sys.executable, "-X", "importtime", "-m", "hpctrain"]) + [
        "-m", "hydra/sweeper=search", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}", *extra]
    proc, took = run(cmd, tmp)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    wait_gone(array_job(sweep))
    return sweep, took, proc.stdout + proc.stderr


def best(trials: list, direction: str = "min") -> Optional[float]:
    values = [t.value for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    return (min(values) if direction == "min" else max(values)) if values else None


def steps_run(sweep: Path) -> int:
    total = 0
    for d in sweep.glob("trial-*"):
        try:
            total += int(json.loads((d / "metrics.json").read_text()).get("step") or 0)
        except (OSError, ValueError):
            pass
    return total


def part_a(tmp: Path, seeds: List[int]) -> None:
    rows: Dict[str, List[float]] = {"tpe": [], "random": []}
    for seed in seeds:
        for sampler in rows:
            sweep, _, _ = study(tmp, f"a-{sampler}-{seed}", SPACE + TASK + [
                f"hydra.sweeper.sampler={sampler}", f"hydra.sweeper.seed={seed}", "hydra.sweeper.n_trials=32",
                "hydra.sweeper.n_workers=4", "hydra.sweeper.pruner=none"])
            rows[sampler].append(best(load_trials(sweep)))
            print(f"(a) seed {seed} {sampler}: best val/loss {rows[sampler][-1]:.4f}", flush=True)
    print(f"(a) best val/loss, mean over seeds {seeds}: tpe {statistics.mean(rows['tpe']):.4f}, "
          f"random {statistics.mean(rows['random']):.4f}")


def part_b(tmp: Path, seeds: List[int]) -> None:
    out: Dict[str, List[Tuple[int, float]]] = {"none": [], "median": [], "asha": []}
    for seed in seeds:
        for pruner in out:
            sweep, _, _ = study(tmp, f"b-{pruner}-{seed}", SPACE + TASK + [
                "hydra.sweeper.sampler=tpe", f"hydra.sweeper.seed={seed}", "hydra.sweeper.n_trials=32",
                "hydra.sweeper.n_workers=4", f"hydra.sweeper.pruner={pruner}"])
            out[pruner].append((steps_run(sweep), best(load_trials(sweep))))
            print(f"(b) seed {seed} pruner={pruner}: {out[pruner][-1][0]} steps, best val/loss "
                  f"{out[pruner][-1][1]:.4f}", flush=True)
    base_steps = statistics.mean(s for s, _ in out["none"])
    base_best = statistics.mean(b for _, b in out["none"])
    for pruner in ("median", "asha"):
        steps = statistics.mean(s for s, _ in out[pruner])
        b = statistics.mean(v for _, v in out[pruner])
        print(f"(b) pruner={pruner}: {100 * (1 - steps / base_steps):.0f} % fewer steps than none, best val/loss "
              f"{b:.4f} vs {base_best:.4f} ({100 * (b - base_best) / base_best:+.1f} %)")


def part_c(tmp: Path) -> None:
    sweep = tmp / "c"
    cmd = [sys.executable, "-X", "importtime", "-m", "hpctrain", "-m", "hydra/sweeper=search", "hydra/launcher=slurm",
           f"hydra.sweep.dir={sweep}", *SPACE, *TASK, "hydra.sweeper.n_trials=8", "hydra.sweeper.n_workers=4",
           "+hydra.launcher.additional_parameters.hold=true"]
    proc, took = run(cmd, tmp)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    subprocess.run(["scancel", array_job(sweep)], capture_output=True)
    torch = bool(re.search(r"\|\s+torch$", proc.stderr, re.M))
    optuna = bool(re.search(r"\|\s+optuna$", proc.stderr, re.M))
    print(f"(c) imported torch: {torch}; imported optuna: {optuna}")
    print(f"(c) command start to return (array queued, held): {took:.2f} s")


def busy_share(spans: List[Tuple[float, float]], slots: int) -> Tuple[float, float]:
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    return sum(e - s for s, e in spans) / (slots * (last - first)), last - first


def part_d(tmp: Path, hydra_python: Optional[str]) -> None:
    space = ["x=interval(0,1)", "hydra.sweeper.n_trials=16", "hydra.sweeper.n_workers=4", "hydra.sweeper.seed=0",
             "hydra.sweeper.pruner=none"]
    app = [sys.executable, str(ROOT / "benchmarks" / "sleep_app.py")]
    t0 = time.time()
    sweep, took, _ = study(tmp, "d-hpctrain", space, app=app)
    wall = time.time() - t0
    spans = [(t.datetime_start.timestamp(), t.datetime_complete.timestamp()) for t in load_trials(sweep)
             if t.datetime_complete is not None]
    share, span = busy_share(spans, 4)
    by_worker: Dict[str, List[Tuple[float, float]]] = {}
    for t in load_trials(sweep):
        lease = json.loads((sweep / ".hpctrain" / "trials" / f"{t.number}.json").read_text())
        if t.datetime_complete is not None:
            by_worker.setdefault(lease["owner"], []).append((t.datetime_start.timestamp(),
                                                             t.datetime_complete.timestamp()))
    own = statistics.mean(busy_share(v, 1)[0] for v in by_worker.values())
    print(f"(d) hpctrain: each worker busy {100 * own:.1f} % of its own span (first trial start to last trial end)")
    print(f"(d) hpctrain: {len(spans)} trials, {wall:.1f} s wall, {100 * share:.0f} % of the 4 slots busy between "
          f"the first trial's start and the last one's end ({span:.1f} s); login-node command gone after {took:.2f} s")
    if hydra_python:
        part_d_hydra(tmp, hydra_python)


def part_d_hydra(tmp: Path, python: str) -> None:
    """Hydra's Optuna sweeper over hydra-submitit-launcher: batches of 4 that wait for their slowest trial."""
    sweep = tmp / "d-hydra"
    cmd = [python, str(ROOT / "benchmarks" / "sleep_app.py"), "-m", "hydra/sweeper=optuna",
           "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=16",
           "hydra.sweeper.n_jobs=4", "hydra.sweeper.sampler.seed=0", "x=interval(0,1)",
           "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""))
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    spans = []
    for log in (sweep / ".submitit").glob("*/*_log.out"):
        text = log.read_text()
        stamps = re.findall(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\)", text)
        if len(stamps) >= 2:
            to_s = [datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f").timestamp() for s in stamps]
            spans.append((min(to_s), max(to_s)))
    share, span = busy_share(spans, 4)
    print(f"(d) Hydra Optuna sweeper + submitit: {len(spans)} trials, {wall:.1f} s wall, {100 * share:.0f} % of the "
          f"4 slots busy ({span:.1f} s); its login-node process alive throughout ({wall:.1f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("a", "b", "c", "d"), action="append", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--hydra-python", help="python of a venv with hydra-optuna-sweeper and hydra-submitit-launcher")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-search-bench-") as d:
        tmp = Path(d)
        for part in args.part:
            if part == "a":
                part_a(tmp, args.seeds)
            elif part == "b":
                part_b(tmp, args.seeds)
            elif part == "c":
                part_c(tmp)
            else:
                part_d(tmp, args.hydra_python)


if __name__ == "__main__":
    main()
