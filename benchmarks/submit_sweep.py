"""Submitting a 1000-point sweep (lr 40 values x seed 25 values) to Slurm: how long until it is queued.

``--points 10000`` (a multiple of 40): lr 40 values x seed N/40 values; past the cluster's MaxArraySize
it is queued as several arrays, one sbatch each.

Runs the real command on the Slurm cluster of this machine, from a temporary directory:

    python -X importtime -m hpctrain -m lr=<40 values> seed=range(25) max_steps=10 hydra/launcher=slurm \
        +hydra.launcher.additional_parameters.hold=true hydra.sweep.dir=<tmp>/sweep

`hold=true` queues the array held (`#SBATCH --hold`), so its 1000 tasks never start and do not hold up
other work on the cluster; it is cancelled (`scancel`) right after. An `sbatch` earlier on PATH logs
each call (start, end, exit status) and runs the real one. Figures printed:
- wall time from command start to its return (it returns once the array is queued),
- time from command start to the sbatch call,
- the number of sbatch calls (must be 1),
- whether the login-node process imported torch (from `-X importtime`).

With --hsl-python PYTHON (a venv holding hydra-submitit-launcher==1.2.0 and hydra-core==1.3.2, see
benchmarks/README.md), the same 1000-point sweep of a trivial Hydra app goes through
hydra-submitit-launcher's `submitit_slurm`; it blocks until the jobs end, so its figure is the time
from command start to its sbatch call; the process is then killed and the array cancelled.

Raw submitit is measured in the same run, as the figure to compare with (the ratio holds on a loaded
machine where wall times do not): a fresh ``python`` that imports submitit and queues the same number of
array tasks of a trivial function, held, with ``map_array`` in arrays of at most 1000 tasks (the test
cluster's MaxArraySize 1001; hpctrain cuts its arrays the same way), then is cancelled.

The last line printed is hpctrain's wall time to queued, in seconds, and its ratio to raw submitit's.

    python benchmarks/submit_sweep.py [--points 10000 --runs-per-task 2] [--profile [--profile-out FILE]]
        [--hsl-python /tmp/hsl-venv/bin/python [--hsl-hpctrain-app]] [--sbatch fake]
"""

import argparse
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

LRS = [f"{10 ** (-5 + 3 * i / 39):.3g}" for i in range(40)]  # 1e-05 .. 0.01, log-spaced
SWEEP = [f"lr={','.join(LRS)}", "seed=range(25)"]
HOLD = "+hydra.launcher.additional_parameters.hold=true"

HSL_APP = '''
import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name="config")
def main(cfg: DictConfig) -> float:
    return float(cfg.lr) * (cfg.seed + 1)


if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="config", node={"lr": 1e-3, "seed": 0})
    main()
'''

# Runs `python -m hpctrain ...` with timers around the login node's phases, printed to stderr at exit.
# Hydra's plugin scan re-executes the plugin modules, so the launcher is patched once the scan is done
# (once Hydra has made the sweeper, which makes the launcher, just before the sweep starts).
PHASES_BOOT = r'''
import atexit, runpy, sys, time
T0 = time.perf_counter()
from hydra.core.plugins import Plugins
phases = {}
ORDER = ["launcher.launch (all below)", "  constant_keys", "  plan_runs (compose groups once, copy per point)",
         "  check (resources, container, validate_job per point)",
         "  take_snapshot (copy the code once, record what ran)", "  record_submission (manifest, events)",
         "  send (submitit map_array, sbatch)", "  record_job_ids"]
def timed(owner, name, key):
    f = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
    setattr(owner, name, wrapper)
def patch_launcher():
    L = sys.modules["hpctrain.submit.launcher"]
    S = sys.modules["hpctrain.submit.backends.slurm"]
    for key in ORDER:
        phases.setdefault(key, 0.0)
    timed(L.BaseLauncher, "launch", ORDER[0])
    timed(L, "constant_keys", ORDER[1])
    timed(L, "plan_runs", ORDER[2])
    timed(L.BaseLauncher, "check", ORDER[3])
    timed(L.BaseLauncher, "take_snapshot", ORDER[4])
    timed(L.BaseLauncher, "record_submission", ORDER[5])
    timed(S.SlurmLauncher, "send", ORDER[6])
    timed(L.BaseLauncher, "record_job_ids", ORDER[7])
instantiate_sweeper = Plugins.instantiate_sweeper
def instantiate_then_patch(self, *args, **kwargs):
    sweeper = instantiate_sweeper(self, *args, **kwargs)
    phases["start -> the sweep (imports, Hydra's first compose, plugin scan)"] = time.perf_counter() - T0
    patch_launcher()
    return sweeper
Plugins.instantiate_sweeper = instantiate_then_patch
def report():
    print(f"PHASE total (in process) {time.perf_counter() - T0:.2f}", file=sys.stderr)
    for key, value in phases.items():
        print(f"PHASE {key} {value:.2f}", file=sys.stderr)
atexit.register(report)
sys.argv = ["hpctrain"] + sys.argv[1:]
runpy.run_module("hpctrain", run_name="__main__", alter_sys=True)
'''

# Raw submitit: the same number of held array tasks, in arrays of at most 1000, from a fresh interpreter.
RAW_SUBMITIT = r'''
import math, sys, time
T0 = time.perf_counter()
import submitit
n, folder = int(sys.argv[1]), sys.argv[2]
executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
executor.update_parameters(timeout_min=5, slurm_additional_parameters={"hold": True}, slurm_array_parallelism=256)
t = time.perf_counter()
jobs = []
for first in range(0, n, 1000):
    jobs += executor.map_array(math.sqrt, list(range(first, min(n, first + 1000))))
print(f"RAW {len(jobs)} {time.perf_counter() - t:.3f} {time.perf_counter() - T0:.3f}")
'''

SBATCH_WRAPPER = '''#!/bin/sh
start=$(date +%s.%N)
{real} "$@"
rc=$?
printf '%s %s %s\\n' "$start" "$(date +%s.%N)" "$rc" >> "$SBATCH_CALLS_LOG"
exit $rc
'''


# --sbatch fake: answers as sbatch does without asking Slurm (nothing queued: 10,000 held tasks and the raw
# submitit run beside them do not fit under the test cluster's MaxJobCount of 10,000 within MinJobAge)
FAKE_SBATCH = '''#!/bin/sh
start=$(date +%s.%N)
n=$(cat "$SBATCH_CALLS_LOG.counter" 2>/dev/null || echo 4000000)
n=$((n + 1))
echo "$n" > "$SBATCH_CALLS_LOG.counter"
echo "Submitted batch job $n"
printf '%s %s %s\\n' "$start" "$(date +%s.%N)" 0 >> "$SBATCH_CALLS_LOG"
'''


def make_bin(tmp: Path, fake: bool = False) -> Path:
    real = shutil.which("sbatch")
    if real is None and not fake:
        sys.exit("no sbatch on PATH: start the test cluster (bash slurm/test-cluster.sh start)")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(FAKE_SBATCH if fake else SBATCH_WRAPPER.format(real=real))
    wrapper.chmod(0o755)
    return bin_dir


def sbatch_calls(log: Path) -> List[List[float]]:
    if not log.exists():
        return []
    return [[float(x) for x in line.split()] for line in log.read_text().splitlines() if line.strip()]


def cancel_jobs_from(cwd: Path) -> List[str]:
    """scancel every job whose submit directory is cwd (Slurm records it: squeue %Z)."""
    out = subprocess.run(["squeue", "-h", "-o", "%F %Z"], capture_output=True, text=True, timeout=60)
    ids = sorted({line.split(" ", 1)[0] for line in out.stdout.splitlines() if line.split(" ", 1)[-1] == str(cwd)})
    if ids:
        subprocess.run(["scancel", *ids], check=False, timeout=60)
    return ids


def queued_tasks(cwd: Path) -> int:
    """Array tasks in the queue submitted from ``cwd`` (all arrays of the sweep)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %Z"], capture_output=True, text=True, timeout=60)
    return sum(line.split(" ", 1)[-1] == str(cwd) for line in out.stdout.splitlines())


def child_cpu() -> float:
    """CPU seconds (user + system) of the children this process has reaped so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_hpctrain(tmp: Path, bin_dir: Path, profile: bool, profile_out: str = "") -> Dict[str, object]:
    cwd = tmp / "hpctrain"
    cwd.mkdir()
    log = tmp / "sbatch_hpctrain.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SBATCH_CALLS_LOG=str(log))
    prof = ["-m", "cProfile", "-o", str(tmp / "hpctrain.prof")] if profile else []
    entry = ["-m", "hpctrain"] if profile else ["-c", PHASES_BOOT]
    cmd = [sys.executable, "-X", "importtime", *prof, *entry, "-m", *SWEEP, "max_steps=10",
           "hydra/launcher=slurm", HOLD, f"hydra.sweep.dir={cwd / 'sweep'}"]
    cpu0, t0 = child_cpu(), time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall, cpu = time.time() - t0, child_cpu() - cpu0
    try:
        if proc.returncode != 0:
            sys.exit(f"hpctrain sweep failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
        match = re.search(r"submitted (\d+) run\(s\) as (?:Slurm job|\d+ Slurm arrays) (\d+)", proc.stdout)
        runs, job = (int(match[1]), match[2]) if match else (0, "?")
        tasks = queued_tasks(cwd) if match else 0
    finally:
        cancelled = cancel_jobs_from(cwd)
    calls = sbatch_calls(log)
    modules = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    torch_modules = [m for m in modules if m == "torch" or m.startswith("torch.")]
    phases = [line[len("PHASE "):].rsplit(" ", 1) for line in proc.stderr.splitlines() if line.startswith("PHASE ")]
    if profile:
        import pstats

        print("hpctrain cProfile, top 25 by cumulative time:")
        pstats.Stats(str(tmp / "hpctrain.prof")).sort_stats("cumulative").print_stats(25)
        if profile_out:
            shutil.copy(tmp / "hpctrain.prof", profile_out)
    return {"wall": wall, "cpu": cpu, "to_sbatch": calls[0][0] - t0 if calls else None,
            "sbatch_s": calls[0][1] - calls[0][0] if calls else None, "sbatch_calls": len(calls), "runs": runs,
            "job": job, "queued_tasks": tasks, "torch": bool(torch_modules), "modules": len(modules),
            "cancelled": cancelled, "phases": phases}


def run_raw_submitit(tmp: Path, bin_dir: Path, n_tasks: int) -> Dict[str, object]:
    """Raw submitit ``map_array`` of ``n_tasks`` held tasks, command start to its return; then cancelled."""
    cwd = tmp / "raw-submitit"
    cwd.mkdir()
    log = tmp / "sbatch_raw.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SBATCH_CALLS_LOG=str(log))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", RAW_SUBMITIT, str(n_tasks), str(cwd / "submitit")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.time() - t0
    try:
        tasks = queued_tasks(cwd)
    finally:
        cancelled = cancel_jobs_from(cwd)
    match = re.search(r"^RAW (\d+) ([\d.]+) ([\d.]+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not match:
        sys.exit(f"raw submitit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return {"wall": wall, "map_array_s": float(match[2]), "tasks": int(match[1]), "queued_tasks": tasks,
            "sbatch_calls": len(sbatch_calls(log)), "cancelled": cancelled}


def run_hsl(tmp: Path, bin_dir: Path, python: str, hpctrain_app: bool) -> Dict[str, object]:
    """hydra-submitit-launcher on the trivial app, or on hpctrain's own app (same config as ours)."""
    name = "hsl-hpctrain" if hpctrain_app else "hsl"
    cwd = tmp / name
    cwd.mkdir()
    (cwd / "app.py").write_text(HSL_APP)
    log = tmp / f"sbatch_{name}.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SBATCH_CALLS_LOG=str(log))
    app = ["-m", "hpctrain", "-m", *SWEEP, "max_steps=10"] if hpctrain_app else ["app.py", "-m", *SWEEP]
    cmd = [python, *app, "hydra/launcher=submitit_slurm", HOLD, f"hydra.sweep.dir={cwd / 'sweep'}"]
    cpu0, t0 = child_cpu(), time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        while not log.exists() and proc.poll() is None and time.time() - t0 < 600:
            time.sleep(0.05)
        calls = sbatch_calls(log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # our own process group: the app and nothing else
        _, err = proc.communicate(timeout=60)
        cancelled = cancel_jobs_from(cwd)
    cpu = child_cpu() - cpu0  # up to the kill, which comes right after the sbatch call
    if not calls:
        sys.exit(f"hydra-submitit-launcher never called sbatch (exit {proc.returncode}):\n{err[-3000:]}")
    return {"cpu": cpu, "to_sbatch": calls[0][0] - t0, "sbatch_s": calls[0][1] - calls[0][0],
            "sbatch_calls": len(calls), "cancelled": cancelled}


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hsl-python", help="python of a venv with hydra-submitit-launcher==1.2.0, hydra-core==1.3.2")
    ap.add_argument("--hsl-hpctrain-app", action="store_true",
                    help="also run hpctrain's own app through hydra-submitit-launcher (hpctrain installed "
                         "--no-deps in that venv: the login node needs no torch)")
    ap.add_argument("--profile", action="store_true", help="cProfile hpctrain's login-node process")
    ap.add_argument("--profile-out", default="", help="--profile: keep the profile in this file (pstats)")
    ap.add_argument("--points", type=int, default=1000, help="sweep size, a multiple of 40 (default 1000)")
    ap.add_argument("--runs-per-task", type=int, default=1,
                    help="hydra.launcher.runs_per_task (10,000 tasks do not fit under Slurm's default MaxJobCount)")
    ap.add_argument("--sbatch", choices=("real", "fake"), default="real",
                    help="fake: an sbatch that answers without queueing (both hpctrain and raw submitit use it)")
    args = ap.parse_args(argv)
    SWEEP[1] = f"seed=range({args.points // 40})"
    SWEEP.append(f"hydra.launcher.runs_per_task={args.runs_per_task}")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="submit-sweep-") as name:
        tmp = Path(name)
        bin_dir = make_bin(tmp, args.sbatch == "fake")
        hsl = run_hsl(tmp, bin_dir, args.hsl_python, False) if args.hsl_python else None
        hsl_app = run_hsl(tmp, bin_dir, args.hsl_python, True) if args.hsl_python and args.hsl_hpctrain_app else None
        raw = run_raw_submitit(tmp, bin_dir, -(-args.points // args.runs_per_task))  # the tasks hpctrain queues
        ours = run_hpctrain(tmp, bin_dir, args.profile, args.profile_out)
    if args.sbatch == "fake":
        print("sbatch: FAKE (answers 'Submitted batch job N' without asking Slurm: nothing was queued)")
    print(f"sweep: {len(LRS)} lr x {args.points // 40} seed = {args.points // 40 * 40} points; cpus: {os.cpu_count()}; "
          f"load average at start: {load[0]:.1f} (other work on the machine slows the wall times)")
    print(f"hpctrain: {ours['runs']} runs as Slurm job {ours['job']} ({ours['queued_tasks']} array tasks queued in all, "
          f"held; cancelled {', '.join(ours['cancelled']) or 'nothing'})")
    print(f"hpctrain: sbatch calls: {ours['sbatch_calls']}")
    print(f"hpctrain: torch imported on the login node: {'YES' if ours['torch'] else 'no'} "
          f"({ours['modules']} modules imported)")
    print(f"hpctrain: command start -> sbatch call: {ours['to_sbatch']:.2f} s "
          f"(sbatch itself {ours['sbatch_s']:.2f} s; CPU time of the whole command {ours['cpu']:.1f} s)")
    if ours["phases"]:
        print("hpctrain: where the login node's time goes (s):")
        for key, value in ours["phases"]:
            print(f"  {value:>7}  {key}")
    for what, res in (("a trivial app", hsl), ("hpctrain's app", hsl_app)):
        if res:
            print(f"hydra-submitit-launcher 1.2.0, {what}: command start -> sbatch call: {res['to_sbatch']:.2f} s "
                  f"(CPU time {res['cpu']:.1f} s; sbatch calls: {res['sbatch_calls']}; then killed, "
                  f"cancelled {', '.join(res['cancelled']) or 'nothing'})")
    print(f"raw submitit: {raw['tasks']} tasks by map_array in {raw['sbatch_calls']} sbatch call(s) "
          f"({raw['queued_tasks']} queued, held; cancelled {', '.join(raw['cancelled']) or 'nothing'}): command start -> "
          f"queued {raw['wall']:.2f} s (the map_array calls {raw['map_array_s']:.2f} s)")
    print(f"hpctrain: command start -> queued (command returned): {ours['wall']:.2f} s; raw submitit {raw['wall']:.2f} s; "
          f"ratio {ours['wall'] / raw['wall']:.2f}")


if __name__ == "__main__":
    main()
