"""The login-node figures of two commits side by side: 1,000 points queued, ``status`` and ``to_pandas()`` on
10,000 runs, each repeat running the base commit and this checkout one right after the other (A, B, A, B, ...).

The base commit (default c674726, the last commit before issue 28's work) is checked out in a shared clone in
a temporary directory and put first on ``PYTHONPATH`` (the venv's editable install of this checkout is a plain
path entry that comes after it; the script checks which hpctrain each side imports). Both sides read the same
10,000-run sweep dir, built once as ``status_1000.py`` builds its own, and submit the same 1,000-point sweep
(``submit_sweep.py``'s lr x seed, held) from a fresh directory each time.

``--sbatch fake`` (the default) puts an ``sbatch`` earlier on PATH that answers "Submitted batch job N" without
asking Slurm: the login node's own work is measured, with nothing queued (the cluster's MaxJobCount of 10,000
counts cancelled jobs for MinJobAge, and other sessions share it); ``--sbatch real`` queues each sweep held on
the test cluster and ``scancel``s it right after. squeue, sacct and sacctmgr are the real ones either way.

Printed per figure: each side's median wall time and CPU time (user + system of the command and its children),
the ratio B / A of the medians, and the load average. The figures are the medians; on this shared machine
read the ratios, measured within seconds of each other.

    .venv/bin/python benchmarks/ab_login.py [--base c674726] [--repeats 5] [--runs 10000] [--points 1000]
        [--sbatch fake|real] [--only submit status pandas] [--source SWEEP | --sweep BUILT]
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_1000 import build_sweep, make_source  # noqa: E402
from submit_sweep import HOLD, LRS, cancel_jobs_from  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAKE_SBATCH = '''#!/bin/sh
# answers as sbatch does, without asking Slurm: one job id per call from a counter file
n=$(cat "$FAKE_SBATCH_COUNTER" 2>/dev/null || echo 4000000)
n=$((n + 1))
echo "$n" > "$FAKE_SBATCH_COUNTER"
echo "Submitted batch job $n"
'''
PANDAS = "import sys, hpctrain; f = hpctrain.load(sys.argv[1]).to_pandas(); print(len(f), hpctrain.__file__)"
WHERE = "import hpctrain; print(hpctrain.__file__)"


def unpack(commit: str, dest: Path) -> Path:
    """The commit checked out in a clone of this repository at ``dest`` (a git work tree, as this checkout is:
    the code snapshot of each side is taken alike; ``--shared``: nothing is written to this repository)."""
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", "--detach", commit], check=True)
    return dest


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: List[str], env: Dict[str, str], cwd: Path) -> Tuple[float, float, subprocess.CompletedProcess]:
    cpu0, t0 = child_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if proc.returncode not in (0, 1):
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd[:6])} ...\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return wall, cpu, proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="c674726", help="the commit to compare with (default c674726)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", type=int, default=10000, help="runs of the sweep status and to_pandas read")
    p.add_argument("--points", type=int, default=1000, help="points submitted, a multiple of 40")
    p.add_argument("--runs-per-task", type=int, default=1)
    p.add_argument("--sbatch", choices=("fake", "real"), default="fake")
    p.add_argument("--only", nargs="+", choices=("submit", "status", "pandas"), default=["submit", "status", "pandas"])
    p.add_argument("--source", type=Path, help="a finished sweep whose runs are copied (default: make one)")
    p.add_argument("--sweep", type=Path, help="a sweep dir built before (status_1000.build_sweep): read, not built")
    args = p.parse_args()
    sweep_args = [f"lr={','.join(LRS)}", f"seed=range({args.points // 40})", "max_steps=10",
                  f"hydra.launcher.runs_per_task={args.runs_per_task}", "hydra/launcher=slurm", HOLD]
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="hpctrain-ab-") as name:
        tmp = Path(name)
        base = unpack(args.base, tmp / "base")
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        if args.sbatch == "fake":
            (bin_dir / "sbatch").write_text(FAKE_SBATCH)
            (bin_dir / "sbatch").chmod(0o755)
        path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        sides = {"A": dict(os.environ, PYTHONPATH=str(base), PATH=path, FAKE_SBATCH_COUNTER=str(tmp / "counter")),
                 "B": dict(os.environ, PYTHONPATH=str(ROOT), PATH=path, FAKE_SBATCH_COUNTER=str(tmp / "counter"))}
        for side, env in sides.items():
            where = subprocess.run([sys.executable, "-c", WHERE], env=env, cwd=tmp, capture_output=True, text=True,
                                   check=True).stdout.strip()
            print(f"{side} = {args.base if side == 'A' else 'this checkout'}: imports {where}")
        sweep = None
        if args.sweep:
            sweep = args.sweep.absolute()
        elif "status" in args.only or "pandas" in args.only:
            source = args.source or make_source(tmp)
            sweep = build_sweep(source.absolute(), tmp / "sweep", args.runs)
        results: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
        last: Dict[Tuple[str, str], str] = {}
        for rep in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for figure in args.only:
                for side in ("A", "B"):
                    env = sides[side]
                    if figure == "submit":
                        cwd = tmp / f"submit-{side}-{rep}"
                        cwd.mkdir()
                        try:
                            wall, cpu, proc = timed([sys.executable, "-m", "hpctrain", "-m", *sweep_args,
                                                     f"hydra.sweep.dir={cwd / 'sweep'}"], env, cwd)
                        finally:
                            if args.sbatch == "real":
                                cancel_jobs_from(cwd)
                        shutil.rmtree(cwd, ignore_errors=True)
                        out = next((ln for ln in proc.stdout.splitlines() if "submitted" in ln), proc.stdout[-200:])
                    elif figure == "status":
                        wall, cpu, proc = timed([sys.executable, "-m", "hpctrain", "status", str(sweep)], env, tmp)
                        out = proc.stdout.strip().splitlines()[-1]
                    else:
                        wall, cpu, proc = timed([sys.executable, "-c", PANDAS, str(sweep)], env, tmp)
                        out = proc.stdout.strip()
                    results.setdefault((figure, side), []).append((wall, cpu))
                    last[(figure, side)] = out
        loads.append(os.getloadavg()[0])
    titles = {"submit": f"{args.points} points queued (sbatch {args.sbatch}), command start -> return",
              "status": f"status on {args.runs} runs, whole CLI", "pandas": f"load().to_pandas() on {args.runs} runs"}
    print(f"repeats {args.repeats}, A/B alternating; load average {min(loads):.1f}-{max(loads):.1f} "
          f"(at start {loads[0]:.1f}, end {loads[-1]:.1f}); cpus {os.cpu_count()}")
    for figure in args.only:
        a, b = results[(figure, "A")], results[(figure, "B")]
        wa, wb = statistics.median(w for w, _ in a), statistics.median(w for w, _ in b)
        ca, cb = statistics.median(c for _, c in a), statistics.median(c for _, c in b)
        print(f"{titles[figure]}:")
        print(f"  A {args.base}: wall median {wa:.2f} s (all {', '.join(f'{w:.2f}' for w, _ in a)}), CPU median {ca:.2f} s")
        print(f"  B this checkout: wall median {wb:.2f} s (all {', '.join(f'{w:.2f}' for w, _ in b)}), CPU median {cb:.2f} s")
        print(f"  last output A: {last[(figure, 'A')][:150]}")
        print(f"  last output B: {last[(figure, 'B')][:150]}")
        print(f"  ratio B/A: wall {wb / wa:.3f}, CPU {cb / ca:.3f}")


if __name__ == "__main__":
    main()
