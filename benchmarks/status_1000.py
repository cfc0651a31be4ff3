"""How long `python -m hpctrain status` takes on a 1000-run sweep (the login-node budget is 2 s).

The sweep is made from real run files: a real sweep's run dirs (metrics.json, .hydra/, tb/ event files;
checkpoints left out) are copied 1000 times under a Slurm-style manifest; one run in ten is made
failed, one in ten running (its job id is not in the queue, so status must read its logs to decide),
one in twenty never started. The timed command is the whole CLI in a fresh interpreter, as a user runs it.

    python benchmarks/status_1000.py                      # makes a small real local sweep first (~20 s)
    python benchmarks/status_1000.py --source SWEEP_DIR   # or copies the runs of an existing sweep

``--raw-submitit fake|real``: raw submitit ``map_array`` of as many tasks timed in the same run (see
submit_sweep.py), printed with the ratio.

``--runs 10000``: a sweep past the cluster's array limit, its runs spread over arrays of 1001 tasks (as
the launcher splits them); `squeue` and `sacct` earlier on PATH count the calls status makes (the budget:
one squeue, at most one sacct per invocation).

The last line printed is the figure.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

from hpctrain.core import events

ARRAY_ID = "987650"  # a job id the test cluster never reaches: squeue is asked and knows nothing of it
PER_ARRAY = 1001  # Slurm's default MaxArraySize: a larger sweep is several arrays
COUNTER = '''#!/bin/sh
echo "$(basename "$0")" >> "$HPCTRAIN_CALLS_LOG"
exec {real} "$@"
'''


def counting_bin(work: Path) -> Path:
    """squeue and sacct wrappers that log each call, then run the real command."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).write_text(COUNTER.format(real=real))
            (bin_dir / tool).chmod(0o755)
    return bin_dir


def _copy_run(src: Path, dest: Path) -> None:
    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("checkpoints", "metrics.json", ".hpctrain"),
                    copy_function=link_or_copy)


def build_sweep(source: Path, dest: Path, n: int = 1000) -> Path:
    """A sweep dir of ``n`` runs made from the completed runs of the real sweep ``source``."""
    manifest = json.loads((source / "sweep.json").read_text())
    templates = []
    for spec in manifest["runs"].values():
        run_dir = source / spec["run_dir"]
        metrics = json.loads((run_dir / "metrics.json").read_text())
        if metrics.get("status") == "completed":
            templates.append((run_dir, metrics, spec))
    if not templates:
        raise SystemExit(f"{source}: no completed run to copy")
    folder = dest / ".submitit"
    folder.mkdir(parents=True)
    shutil.copy2(source / "multirun.yaml", dest / "multirun.yaml")
    runs = {}
    now = time.time()
    record_error = "Traceback (most recent call last):\nRuntimeError: synthetic failure"
    for i in range(n):
        run_dir, metrics, spec = templates[i % len(templates)]
        lr = f"{10 ** -(1 + 3 * i / n):.3g}"
        name = f"{i}_lr={lr},seed={i % 7}"
        job_id = f"{int(ARRAY_ID) + i // PER_ARRAY}_{i % PER_ARRAY}"
        runs[str(i)] = {"name": name, "run_dir": name, "overrides": [f"lr={lr}", f"seed={i % 7}"],
                        "job_id": job_id, "max_steps": metrics.get("max_steps")}
        if i % 20 == 7:
            continue  # never started: no run dir, no log
        _copy_run(run_dir, dest / name)
        summary = dict(metrics)
        if i % 10 == 9:
            summary.update(status="failed", error=record_error)
        elif i % 10 == 8:
            summary.update(status="running", step=(metrics.get("max_steps") or 2) // 2, updated=now, started=now - 60)
        (dest / name / "metrics.json").write_text(json.dumps(summary))
        run = dest / name  # its record, written with the record's own transitions
        events.submitted(run)
        events.started(run, job_id=job_id)
        if i % 10 == 9:
            events.failed(run, record_error, rank=0)
        elif i % 10 != 8:
            events.completed(run)
        (folder / f"{job_id}_0_log.out").write_text("submitit INFO - Starting\n" * 20)
        (folder / f"{job_id}_0_log.err").write_text("RuntimeError: synthetic failure\n" if i % 10 == 9 else "")
    (dest / "sweep.json").write_text(json.dumps({
        "launcher": "slurm", "app": "hpctrain.app", "submitit_folder": str(folder),
        "submissions": [{"time": now, "job_ids": [str(int(ARRAY_ID) + a) for a in range((n + PER_ARRAY - 1) // PER_ARRAY)],
                         "runs": list(range(n))}], "runs": runs}))
    return dest


def forget_rows(sweep_dir: Path) -> None:
    """Remove the finished runs' kept rows (hpctrain.review.row_cache): the next read is a cold one."""
    from hpctrain.review import row_cache

    Path(row_cache.file_for(sweep_dir)).unlink(missing_ok=True)


def time_status(sweep_dir: Path, bin_dir: Path, repeats: int = 3, cold: bool = False) -> List[float]:
    """``repeats`` whole-CLI runs; ``cold``: each without the kept rows (the first status of a sweep)."""
    times = []
    log = bin_dir / "calls.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", HPCTRAIN_CALLS_LOG=str(log))
    for _ in range(repeats):
        if cold:
            forget_rows(sweep_dir)
        log.unlink(missing_ok=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep_dir)],
                              capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"status failed ({proc.returncode}):\n{proc.stderr}")
    calls = log.read_text().split() if log.exists() else []
    print(proc.stdout.strip().splitlines()[-1])
    print(f"calls in one status: squeue {calls.count('squeue')}, sacct {calls.count('sacct')}")
    return times


def make_source(work: Path) -> Path:
    sweep = work / "source"
    subprocess.run([sys.executable, "-m", "hpctrain", "-m", "lr=1e-2,1e-3", "max_steps=20",
                    "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=work, check=True,
                   capture_output=True, text=True)
    return sweep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, help="a finished sweep whose runs are copied (default: make one)")
    p.add_argument("--sweep", type=Path, help="a sweep dir built before by build_sweep (with as many runs)")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--raw-submitit", choices=("fake", "real"),
                   help="also time raw submitit map_array of as many tasks in the same run (sbatch fake or real), "
                        "the reference whose ratio holds on a loaded machine")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-status-bench-") as tmp:
        work = Path(tmp)
        if args.sweep:  # built before (build_sweep): read as it is
            sweep = args.sweep.absolute()
        else:
            sweep = build_sweep((args.source or make_source(work)).absolute(), work / "sweep", args.runs)
        bin_dir = counting_bin(work)
        cold = time_status(sweep, bin_dir, cold=True)  # each the first status since the runs ended
        times = time_status(sweep, bin_dir)  # warm: the finished runs' rows kept by the cold ones
        raw = raw_reference(work, args.runs, args.raw_submitit) if args.raw_submitit else None
    ratio = f"; raw submitit map_array of {args.runs} tasks {raw:.2f} s, ratio {statistics.median(times) / raw:.2f}" if (
        raw) else ""
    print(f"cold (no kept rows): {', '.join(f'{t:.2f}' for t in cold)} s; warm: {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"status on {args.runs} runs: {min(times):.2f} s warm (best of {len(times)}; "
          f"median {statistics.median(times):.2f} s; cold best {min(cold):.2f} s; whole CLI in a fresh interpreter; "
          f"load average {os.getloadavg()[0]:.1f}{ratio})")


def raw_reference(work: Path, n: int, sbatch: str) -> float:
    """Raw submitit queueing ``n`` held tasks (``submit_sweep.run_raw_submitit``), command start to return."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import submit_sweep

    ref = work / "raw-reference"
    ref.mkdir()
    result = submit_sweep.run_raw_submitit(ref, submit_sweep.make_bin(ref, sbatch == "fake"), n)
    print(f"raw submitit: {result['tasks']} tasks by map_array (sbatch {sbatch}): {result['wall']:.2f} s")
    return float(result["wall"])  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
