"""Pull workers for a grid sweep (``hydra.launcher.workers=W``, or the queue cap): W tasks pull the points
until all are done, each point run exactly once, under the faults a search's workers survive (a worker
scancelled mid-point, its node set down, the same command again, a slow squeue). Counted from the run dirs:
one dir per point, each completed once."""

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest


from cli_helpers import HELPERS, hpctrain_env
from slurm_helpers import cancel, job_id, queued, record_kinds, run_dirs, wait_for

APP = HELPERS / "foreign_app.py"


def sweep_app(args, cwd: Path, env=None, timeout: float = 300, wait: bool = True):
    cmd = [sys.executable, str(APP), "-m", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env or hpctrain_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=env or hpctrain_env(), capture_output=True, text=True, timeout=timeout)


def exactly_once(sweep: Path, n: int) -> List[List[str]]:
    """One run dir per point, each completed once (the records), none running twice at once."""
    dirs = run_dirs(sweep)
    assert len(dirs) == n, [d.name for d in dirs]
    kinds = [record_kinds(d) for d in dirs]
    for d, k in zip(dirs, kinds):
        assert k.count("completed") == 1 and k[-1] == "completed", (d.name, k)
    return kinds


def worker_stats(sweep: Path) -> List[dict]:
    return [json.loads(p.read_text()) for p in sorted((sweep / ".hpctrain" / "workers").glob("pull-*.json"))]


def test_two_local_workers_pull_six_points_each_once(tmp_path):
    sweep = tmp_path / "s"
    proc = sweep_app(["+x=range(6)", "+sleep_s=0.2", "hydra/launcher=local", "hydra.launcher.workers=2",
                      f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pulled by 2 worker(s)" in proc.stdout
    kinds = exactly_once(sweep, 6)
    assert all(k == ["submitted", "started", "completed"] for k in kinds), kinds
    stats = worker_stats(sweep)
    assert len(stats) == 2 and sum(s["points"] for s in stats) == 6 and all(s["points"] >= 1 for s in stats), stats
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep)], cwd=tmp_path,
                            env=hpctrain_env(), capture_output=True, text=True, timeout=120)
    assert status.stdout.splitlines()[-1] == "6 runs: 6 completed", status.stdout
    again = sweep_app(["+x=range(6)", "+sleep_s=0.2", "hydra/launcher=local", "hydra.launcher.workers=2",
                       f"hydra.sweep.dir={sweep}"], tmp_path)
    assert "all 6 runs of" in again.stdout and "already completed" in again.stdout, again.stdout
    exactly_once(sweep, 6)


# ---------------------------------------------------------------------------------------------- the test cluster
WRAPPERS = HELPERS / "slurm_wrappers"


def submit(tmp_path: Path, sweep: Path, n: int, workers: int, sleep_s: float, env=None, *extra: str):
    args = [f"+x=range({n})", f"+sleep_s={sleep_s}", "hydra/launcher=slurm", f"hydra.launcher.workers={workers}",
            f"hydra.sweep.dir={sweep}", *extra]
    proc = sweep_app(args, tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"({workers} workers pulling the runs)" in proc.stdout, proc.stdout
    return args, job_id(sweep)


def started_by(sweep: Path) -> dict:
    """Each point that has started, by its run dir: the job ids of its starts."""
    out = {}
    for d in run_dirs(sweep):
        starts = sorted((d / ".hpctrain" / "record").glob("*.started.*"))
        if starts:
            out[d] = [json.loads(p.read_text())["job_id"] for p in starts]
    return out


def running_point(sweep: Path) -> "tuple[Path, str]":
    """A point under way (started, not ended) and the worker that runs it."""
    found = []

    def look() -> bool:
        for d, jobs in started_by(sweep).items():
            kinds = record_kinds(d)
            if kinds[-1] == "started":
                found.append((d, jobs[-1]))
                return True
        return False

    wait_for(look, 300, "a worker to start a point")
    return found[0]


def kill(sweep: Path, owner: str) -> Path:
    """The worker dies mid-point with no word (a plain scancel's SIGTERM is let run on by submitit for
    Slurm's KillWait): its steps SIGKILLed, then the job cancelled. The point it held then."""
    subprocess.run(["scancel", "--signal=KILL", owner], check=True)
    wait_for(lambda: _step_gone(owner), 60, "the killed worker's step to end")
    subprocess.run(["scancel", owner], check=True)
    held = [d for d, jobs in started_by(sweep).items() if jobs[-1] == owner and record_kinds(d)[-1] == "started"]
    assert len(held) == 1, held
    return held[0]


def _step_gone(owner: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-s", "-j", owner, "-o", "%i"], capture_output=True, text=True).stdout
    return not out.strip()


@pytest.mark.slurm
def test_a_worker_scancelled_mid_point_its_point_is_adopted_and_each_point_completes_once(tmp_path, slurm_cluster):
    sweep = tmp_path / "s"
    _, job = submit(tmp_path, sweep, 10, 3, 3)
    try:
        _, owner = running_point(sweep)
        point = kill(sweep, owner)
        wait_for(lambda: not queued(job), 600, "the workers to finish")
        kinds = exactly_once(sweep, 10)
        assert record_kinds(point).count("started") == 2, record_kinds(point)  # taken up again by another worker
        starts = json.loads(sorted((point / ".hpctrain" / "record").glob("*.started.*"))[-1].read_text())
        assert starts["job_id"] != owner
        assert sum(k.count("started") for k in kinds) == 11, kinds
    finally:
        cancel(job)


def resume(node: str) -> None:
    """The node back in service (it may have come back by itself when its slurmd registered again)."""
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    wait_for(lambda: node not in subprocess.run(["sinfo", "-h", "-t", "down,drain,drng", "-N", "-o", "%N"],
                                                capture_output=True, text=True).stdout, 60, f"{node} back")


@pytest.mark.slurm
def test_a_workers_node_set_down_each_point_completes_once(tmp_path, slurm_cluster):
    """Both workers pinned to n2; n2 drained (no other job lands there), then set down under them: Slurm
    requeues them (held, perhaps: released here once n2 is back); each takes its own point back."""
    sweep = tmp_path / "s"
    _, job = submit(tmp_path, sweep, 8, 2, 3, None, "+hydra.launcher.additional_parameters.nodelist=n2")
    touched = False
    try:
        running_point(sweep)
        touched = True
        subprocess.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=hpctrain-test"], check=True)
        wait_for(lambda: {j.split("_")[0] for j in _jobs_on("n2")} == {job}, 300, "n2 to hold this job only")
        held = {d for d, jobs in started_by(sweep).items() if record_kinds(d)[-1] == "started"}
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=hpctrain-test"], check=True)
        wait_for(lambda: all(" RUNNING" not in line for line in queued(job)), 120, "the workers to be requeued")
        resume("n2")
        subprocess.run(["scontrol", "release", job], capture_output=True)  # a held job waits for it
        wait_for(lambda: not queued(job), 600, "the workers to finish")
        exactly_once(sweep, 8)
        assert held and all(record_kinds(d).count("started") >= 2 for d in held), [record_kinds(d) for d in held]
    finally:
        cancel(job)
        if touched:
            resume("n2")


def _jobs_on(node: str) -> list:
    out = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i"], capture_output=True, text=True, timeout=30).stdout
    return out.split()


@pytest.mark.slurm
def test_the_same_command_again_while_workers_run_submits_nothing_and_each_point_completes_once(tmp_path,
                                                                                              slurm_cluster):
    sweep = tmp_path / "s"
    args, job = submit(tmp_path, sweep, 8, 2, 8)
    try:
        running_point(sweep)
        again = sweep_app(args, tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "left alone, still queued or running" in again.stdout, again.stdout
        assert "submitted" not in again.stdout.replace("nothing to submit", ""), again.stdout
        wait_for(lambda: not queued(job), 600, "the workers to finish")
        kinds = exactly_once(sweep, 8)
        assert all(k.count("started") == 1 for k in kinds), kinds
        third = sweep_app(args, tmp_path)
        assert "all 8 runs of" in third.stdout, third.stdout
        assert len(json.loads((sweep / "sweep.json").read_text())["submissions"]) == 1
    finally:
        cancel(job)


@pytest.mark.slurm
def test_a_slow_squeue_every_other_call_each_point_completes_once(tmp_path, slurm_cluster):
    """The workers' squeue (asked at the end, about a scancelled worker's point) answers after 35 s every
    other call: a call that times out is unknown, never gone; the next one decides."""
    slow = tmp_path / "wrap"
    slow.mkdir()
    (slow / "squeue").symlink_to(WRAPPERS / "slow_every_other")
    env = hpctrain_env()
    env.update(PATH=f"{slow}:{env['PATH']}", SLOW_STATE=str(tmp_path), SLOW_S="35")
    sweep = tmp_path / "s"
    _, job = submit(tmp_path, sweep, 8, 2, 3, env)
    try:
        _, owner = running_point(sweep)
        point = kill(sweep, owner)
        wait_for(lambda: not queued(job), 600, "the workers to finish")
        exactly_once(sweep, 8)
        assert record_kinds(point).count("started") == 2, record_kinds(point)
        assert int((tmp_path / ".squeue.calls").read_text()) >= 2
    finally:
        cancel(job)
