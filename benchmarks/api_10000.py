"""``hpctrain.load(dir).to_pandas()`` on a 10,000-run sweep, in a fresh interpreter, no torch.

The sweep dir is built as ``status_1000.py`` builds its own (a small real local sweep's run files copied
into a Slurm-style sweep of N runs, squeue/sacct counted through wrappers on PATH). Prints the time of the
whole call (best of 3), its CPU time (user + system of the process and its squeue/sacct children: what a
loaded machine does not inflate as much) and whether torch was imported, the figure last.

    .venv/bin/python benchmarks/api_10000.py [--runs 10000] [--raw-submitit fake|real]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_1000 import build_sweep, counting_bin, forget_rows, make_source, raw_reference  # noqa: E402

CODE = """
import sys, time
t0 = time.perf_counter()
import hpctrain
frame = hpctrain.load(sys.argv[1]).to_pandas()
print(f"{time.perf_counter() - t0:.3f} {len(frame)} {'torch' in sys.modules} {int(frame['gpu_hours'].notna().sum())}")
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10000)
    p.add_argument("--source", type=Path, help="a finished sweep whose runs are copied (default: make one)")
    p.add_argument("--sweep", type=Path, help="a sweep dir built before by build_sweep (with as many runs)")
    p.add_argument("--raw-submitit", choices=("fake", "real"),
                   help="also time raw submitit map_array of as many tasks in the same run (sbatch fake or real)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-api-bench-") as tmp:
        work = Path(tmp)
        if args.sweep:  # built before (build_sweep): read as it is
            sweep = args.sweep.absolute()
        else:
            sweep = build_sweep((args.source or make_source(work)).absolute(), work / "sweep", args.runs)
        bin_dir = counting_bin(work)
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                   HPCTRAIN_CALLS_LOG=str(bin_dir / "calls.log"))
        times, inside, cpu = [], [], []
        for n in range(6):  # three cold (the kept rows removed first), then three warm
            if n < 3:
                forget_rows(sweep)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CODE, str(sweep)], capture_output=True, text=True, env=env,
                                 check=True).stdout.split()
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            inside.append(float(out[0]))
        print(f"rows {out[1]}, torch imported: {out[2]}, runs with a cost: {out[3]}")
        calls = (bin_dir / "calls.log").read_text().split() if (bin_dir / "calls.log").exists() else []
        print(f"calls in 6 loads: squeue {calls.count('squeue')}, sacct {calls.count('sacct')}")
        print(f"cold (no kept rows): {', '.join(f'{t:.2f}' for t in times[:3])} s (CPU "
              f"{', '.join(f'{c:.2f}' for c in cpu[:3])}); warm: {', '.join(f'{t:.2f}' for t in times[3:])} s (CPU "
              f"{', '.join(f'{c:.2f}' for c in cpu[3:])}); load average now {os.getloadavg()[0]:.1f}")
        raw = raw_reference(work, args.runs, args.raw_submitit) if args.raw_submitit else None
    warm, cold = times[3:], times[:3]
    ratio = f"; raw submitit map_array of {args.runs} tasks {raw:.2f} s, ratio {statistics.median(warm) / raw:.2f}" if (
        raw) else ""
    print(f"load().to_pandas() on {args.runs} runs: {min(warm):.2f} s warm whole process, {min(inside[3:]):.2f} s in it, "
          f"CPU {min(cpu[3:]):.2f} s (best of 3; median {statistics.median(warm):.2f} s; cold best {min(cold):.2f} s, "
          f"CPU {min(cpu[:3]):.2f} s{ratio})")


if __name__ == "__main__":
    main()
