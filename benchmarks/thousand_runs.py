"""A thousand tiny runs to the end on the Slurm test cluster, packed: wall time and runs per second.

    python benchmarks/thousand_runs.py [--points 1000] [--runs-per-task 10] [--max-steps 5]

Submits ``seed=range(POINTS)`` with ``max_steps`` steps each, ``hydra.launcher.runs_per_task``, and
``hydra.launcher.wait=true`` (the command returns once every run has ended), from a temporary
directory. Then counts from the run dirs alone: runs completed (metrics.json and the run record),
runs lost (no run dir, or not completed), runs that started more than once. Its jobs are cancelled on
the way out. Not a test: it takes minutes, and the figure depends on the cluster's load.

The last line printed is the figure: wall time and runs per second.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.core.state import RunState, State
from hpctrain.core import events


def count(sweep: Path, points: int) -> dict:
    manifest = json.loads((sweep / "sweep.json").read_text())
    out = {"completed": 0, "lost": 0, "twice": 0, "states": {}}
    for idx in range(points):
        spec = manifest["runs"].get(str(idx))
        run_dir = sweep / spec["run_dir"] if spec else None
        rs = events.read(run_dir) if run_dir and run_dir.is_dir() else RunState(None)
        summary = json.loads((run_dir / "metrics.json").read_text()) if run_dir and (run_dir / "metrics.json").exists() else {}
        state = str(rs.state)
        out["states"][state] = out["states"].get(state, 0) + 1
        if rs.state == State.COMPLETED and summary.get("status") == "completed":
            out["completed"] += 1
        else:
            out["lost"] += 1
        if rs.starts > 1:
            out["twice"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--runs-per-task", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=5)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="thousand-runs-") as tmp:
        cwd = Path(tmp)
        sweep = cwd / "sweep"
        cmd = [sys.executable, "-m", "hpctrain", "-m", f"seed=range({args.points})", f"max_steps={args.max_steps}",
               "hydra/launcher=slurm", f"hydra.launcher.runs_per_task={args.runs_per_task}", "hydra.launcher.wait=true",
               f"hydra.sweep.dir={sweep}"]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
            wall = time.time() - t0
        finally:
            out = subprocess.run(["squeue", "-h", "-o", "%F %Z"], capture_output=True, text=True).stdout
            ids = sorted({line.split()[0] for line in out.splitlines() if line.split()[-1] == str(cwd)})
            if ids:
                subprocess.run(["scancel", *ids], check=False)
        print("\n".join(proc.stdout.splitlines()[:3]))
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
        counts = count(sweep, args.points)
    print(f"load average at start: {load:.1f} (2 cores shared with other work)")
    print(f"runs: {args.points}, {args.runs_per_task} per task ({-(-args.points // args.runs_per_task)} tasks), "
          f"max_steps={args.max_steps}; sweep command exit code {proc.returncode}")
    print(f"counted from the run dirs: {counts['completed']} completed, {counts['lost']} lost or not completed, "
          f"{counts['twice']} started more than once; states {counts['states']}")
    print(f"{args.points} runs to the end: {wall:.0f} s wall, {args.points / wall:.2f} runs/s")


if __name__ == "__main__":
    main()
