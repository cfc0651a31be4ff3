"""Pull workers at scale (issue 31 item 2): a grid over a foreign app whose points sleep, worked by W workers.

    .venv/bin/python benchmarks/pull_grid.py --points 100000 --workers 4,16,64 --sleep 0.5

For each worker count: the login command's time (command -> queued), then, once every worker has left the
queue, every point checked from its run dir (one dir per point, each completed exactly once, no point started
twice unless its worker died), the workers' share of their time spent in points, and the latency of each
claim (the worker's call for its next point), p50/p99. Printed as a table, the parameters above it. The
launcher is Slurm by default (the test cluster: W workers run at once only where its nodes declare enough
CPUs, slurm/test-cluster.sh ``HPCTRAIN_TEST_CPUS``); ``--launcher local`` runs the workers on this machine.
Hold the test cluster's lock around a Slurm run: ``flock /tmp/hpctrain-slurm-tests.lock ...``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "helpers" / "foreign_app.py"
sys.path.insert(0, str(ROOT))

from hpctrain.core import events  # noqa: E402
from hpctrain.core.state import EventKind  # noqa: E402


def in_queue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i"], capture_output=True, text=True).stdout
    return bool(out.strip())


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def one(points: int, workers: int, sleep_s: float, launcher: str, root: Path) -> Dict[str, Any]:
    sweep = root / f"w{workers}"
    cmd = [sys.executable, str(APP), "-m", f"+x=range({points})", f"+sleep_s={sleep_s}",
           f"hydra/launcher={launcher}", f"hydra.launcher.workers={workers}", f"hydra.sweep.dir={sweep}"]
    if launcher == "slurm":
        cmd += ["hydra.launcher.timeout_min=600", "hydra.launcher.array_parallelism=1000"]
    began = time.time()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    login_s = time.time() - began
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed: {proc.stderr[-2000:]}")
    if launcher == "slurm":
        job = json.loads((sweep / "sweep.json").read_text())["submissions"][-1]["job_ids"][0]
        while in_queue(job):
            time.sleep(5)
    worked_s = time.time() - began
    dirs = [d for d in sweep.iterdir() if d.is_dir() and not d.name.startswith(".")]
    completed = [sum(e.kind is EventKind.COMPLETED for e in events.read(d).events) for d in dirs]
    started = [sum(e.kind is EventKind.STARTED for e in events.read(d).events) for d in dirs]
    stats = [json.loads(p.read_text()) for p in (sweep / ".hpctrain" / "workers").glob("pull-*.json")]
    claims = [c for s in stats for c in s["claim_s"]]
    return {"workers": workers, "login_s": login_s, "worked_s": worked_s, "dirs": len(dirs),
            "completed_once": sum(c == 1 for c in completed), "started_twice": sum(s > 1 for s in started),
            "in_points": sum(s["in_points_s"] for s in stats) / max(1e-9, sum(s["wall_s"] for s in stats)),
            "ran": sum(s["points"] for s in stats), "reported": len(stats),
            "p50_ms": 1000 * percentile(claims, 0.5), "p99_ms": 1000 * percentile(claims, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--workers", default="4,16,64", help="worker counts, comma-separated")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each point sleeps")
    parser.add_argument("--launcher", choices=("slurm", "local"), default="slurm")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pull-grid-") as tmp:
        for w in (int(x) for x in args.workers.split(",")):
            rows.append(one(args.points, w, args.sleep, args.launcher, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{args.points} points sleeping {args.sleep} s, {args.launcher} launcher, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("workers | login s | worked s | run dirs | completed once | started twice | workers reported | "
          "in points | claim p50 ms | claim p99 ms")
    for r in rows:
        print(f"{r['workers']:>7} | {r['login_s']:7.2f} | {r['worked_s']:8.1f} | {r['dirs']:>8} | "
              f"{r['completed_once']:>14} | {r['started_twice']:>13} | {r['reported']:>16} | {r['in_points']:8.1%} | "
              f"{r['p50_ms']:12.2f} | {r['p99_ms']:12.2f}")
    ok = all(r["completed_once"] == args.points == r["dirs"] for r in rows)
    print(f"every point run exactly once: {'yes' if ok else 'NO'}; in points min "
          f"{min(r['in_points'] for r in rows):.1%}; login max {max(r['login_s'] for r in rows):.2f} s")


if __name__ == "__main__":
    main()
