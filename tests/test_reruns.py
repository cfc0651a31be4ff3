"""Reruns, partial submissions and concurrent submissions (issue 19, items 4, 6, 7, 20, 21): a run is never
submitted twice while its job is queued or running, a job id is recorded as soon as it exists, and a
failed submission leaves the sweep dir usable. Slurm tests run on the real test cluster."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain, skipped
from slurm_helpers import cancel, metrics, queued, record_kinds, run_dirs, wait_for

from hpctrain.core import events, manifest
from hpctrain.core.run import RunSpec
from hpctrain.job.wrapper import SweepJob

WRAPPERS = HELPERS / "slurm_wrappers"
HOLD = "+hydra.launcher.additional_parameters.hold=true"


def sweep_json(sweep: Path) -> dict:
    return json.loads((sweep / "sweep.json").read_text())


def status_json(sweep: Path, env=None) -> dict:
    proc = run_hpctrain(["status", str(sweep), "--json"], cwd=sweep.parent, env=env, check=False)
    return json.loads(proc.stdout)


def states(sweep: Path, env=None) -> dict:
    return {r["idx"]: r["state"] for r in status_json(sweep, env)["runs"]}


def queue_tasks(job_ids) -> list:
    return [line for j in sorted({str(j).split("_")[0] for j in job_ids}) for line in queued(j)]


def all_job_ids(sweep: Path) -> list:
    return sorted({j for s in sweep_json(sweep)["submissions"] for j in s["job_ids"]})


def wrapped_bin(tmp_path: Path, **tools: str) -> Path:
    """A directory of wrappers installed under the tools' names (``sbatch="flaky"``), for the front of PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, wrapper in tools.items():
        shutil.copy(WRAPPERS / wrapper, bin_dir / tool)
    return bin_dir


def sweep_args(sweep: Path, points: str = "1,2", *extra: str) -> list:
    return ["-m", f"seed={points}", "max_steps=20", "log_every=10", "eval_every=0", "hydra/launcher=slurm",
            f"hydra.sweep.dir={sweep}", *extra]


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_rerun_leaves_a_held_array_alone_then_each_run_starts_once(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(sweep_args(sweep, "1,2", HOLD), cwd=tmp_path, timeout=120)
    (first,) = sweep_json(sweep)["submissions"]
    try:
        again = run_hpctrain(sweep_args(sweep, "1,2"), cwd=tmp_path, timeout=120)  # the same command, no hold
        assert "2 run(s) left alone, still queued or running" in again.stdout, again.stdout + again.stderr
        assert len(sweep_json(sweep)["submissions"]) == 1  # nothing submitted again
        assert len(queue_tasks(first["job_ids"])) == 2

        down = {"PATH": f"{wrapped_bin(tmp_path, squeue='flaky')}{os.pathsep}{os.environ['PATH']}",
                "FLAKY_PATTERN": "f", "FLAKY_STATE": str(tmp_path)}
        blind = run_hpctrain(sweep_args(sweep, "1,2"), cwd=tmp_path, env=down, timeout=120)
        assert "not submitted again: the queue did not answer" in blind.stdout, blind.stdout + blind.stderr
        assert len(sweep_json(sweep)["submissions"]) == 1

        subprocess.run(["scontrol", "release", first["job_ids"][0]], check=True, capture_output=True)
        dirs = run_dirs(sweep)
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in dirs), 180, "both runs to complete")
        for d in dirs:
            assert record_kinds(d) == ["submitted", "started", "completed"]
            # one trainer's writer (the utilisation sampler's own file ends in .sys once a run lasts 5 s)
            written = [p.name for p in (d / "tb").glob("events.out.tfevents.*") if not p.name.endswith(".sys")]
            assert len(written) == 1, written
        assert set(states(sweep).values()) == {"completed"}
    finally:
        cancel(first["job_ids"][0])


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_the_same_sweep_submitted_twice_at_once_is_submitted_once(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "hpctrain", *sweep_args(sweep, "1,2,3,4", HOLD)]
    one = subprocess.Popen(cmd, cwd=tmp_path, env=hpctrain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    time.sleep(1.0)
    two = subprocess.Popen(cmd, cwd=tmp_path, env=hpctrain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    outs = [p.communicate(timeout=180) for p in (one, two)]
    try:
        assert one.returncode == 0 and two.returncode == 0, outs
        m = sweep_json(sweep)
        assert len(m["submissions"]) == 1 and len(m["submissions"][0]["runs"]) == 4, m["submissions"]
        assert len(queue_tasks(all_job_ids(sweep))) == 4  # 4 tasks for 4 runs
        assert "4 run(s) left alone, still queued or running" in outs[1][0], outs[1]
    finally:
        run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, check=False, timeout=120)
    wait_for(lambda: not queue_tasks(all_job_ids(sweep)), 30, "the array to leave the queue")


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_cancel_covers_every_array_the_sweep_submitted(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(sweep_args(sweep, "1,2", HOLD), cwd=tmp_path, timeout=120)

    def forget(m: manifest.Manifest) -> None:  # as an older version left it: runs mapped to a later array only
        for entry in m.runs.values():
            entry.job_id = None

    manifest.update(sweep, forget)
    run_hpctrain(sweep_args(sweep, "1,2", HOLD), cwd=tmp_path, timeout=120)
    ids = all_job_ids(sweep)
    try:
        assert len(ids) == 2 and len(queue_tasks(ids)) == 4
        run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, timeout=120)
        wait_for(lambda: not queue_tasks(ids), 30, "both arrays to leave the queue")
    finally:
        for j in ids:
            cancel(j)


def test_a_task_whose_run_is_completed_writes_no_started(tmp_path):
    run_dir = tmp_path / "sweep" / "0_x=1"
    events.submitted(run_dir)
    events.started(run_dir, job_id="7_0")
    events.completed(run_dir, app="app@1")
    spec = RunSpec(0, ("+x=1",), run_dir, None)
    job = SweepJob(str(tmp_path / "no-payload.pkl"), str(tmp_path / "sweep"), "app@1")
    job(spec.to_json(tmp_path / "sweep"))  # a second array's task for the same run: nothing to do
    assert [e.kind.value for e in events.events(run_dir)] == ["submitted", "started", "completed"]


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_an_sbatch_that_fails_on_the_second_array_keeps_the_first_recorded(tmp_path):
    sweep = tmp_path / "sweep"
    bin_dir = wrapped_bin(tmp_path, sbatch="flaky", scontrol="max_array_size")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FLAKY_PATTERN": "of", "FLAKY_STATE": str(tmp_path),
           "MAX_ARRAY_SIZE": "2"}
    proc = run_hpctrain(sweep_args(sweep, "1,2,3", HOLD), cwd=tmp_path, env=env, check=False, timeout=120)
    m = sweep_json(sweep)
    (first,) = m["submissions"][0]["job_ids"]
    try:
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert f"1 of 2 arrays queued (job {first}); array 2 failed:" in proc.stderr, proc.stderr
        assert f"python -m hpctrain cancel {sweep}" in proc.stderr
        assert [m["runs"][i]["job_id"] for i in "012"] == [f"{first}_0", f"{first}_1", None]
        assert len(queue_tasks([first])) == 2
        assert [states(sweep)[i] for i in (0, 1)] == ["held", "held"]  # queued with a user hold

        rest = run_hpctrain(sweep_args(sweep, "1,2,3", HOLD), cwd=tmp_path, timeout=120)  # sbatch works again
        assert "2 run(s) left alone, still queued or running" in rest.stdout, rest.stdout
        m = sweep_json(sweep)
        assert m["submissions"][-1]["runs"] == [2] and m["runs"]["2"]["job_id"]
        assert len(queue_tasks(all_job_ids(sweep))) == 3
    finally:
        run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, check=False, timeout=120)
        for j in all_job_ids(sweep):
            cancel(j)
    assert set(states(sweep).values()) == {"cancelled"}


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_an_array_queued_by_a_command_killed_before_it_recorded_it_is_cancelled_by_the_rerun(tmp_path):
    """The login command killed right after its 2nd array's sbatch: that array is in no sweep.json. The same
    command again cancels it before submitting its runs again; else both jobs would run them."""
    sweep = tmp_path / "sweep"
    bin_dir = wrapped_bin(tmp_path, sbatch="killed_after", scontrol="max_array_size")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "KILL_AT": "2", "KILL_STATE": str(tmp_path),
           "MAX_ARRAY_SIZE": "2"}
    killed = run_hpctrain(sweep_args(sweep, "1,2,3", HOLD), cwd=tmp_path, env=env, check=False, timeout=120)
    orphan = "".join(c for c in (tmp_path / ".sbatch.killed").read_text() if c.isdigit())
    try:
        assert killed.returncode == -9, killed.stdout + killed.stderr
        (first,) = sweep_json(sweep)["submissions"][0]["job_ids"]
        assert orphan and orphan != first and len(queued(orphan)) == 1  # queued, recorded nowhere
        assert sweep_json(sweep)["runs"]["2"]["job_id"] is None

        rest = run_hpctrain(sweep_args(sweep, "1,2,3", HOLD), cwd=tmp_path, env={"MAX_ARRAY_SIZE": "2"}, timeout=180)
        assert f"cancelled Slurm job(s) {orphan}: queued by an earlier command of this sweep" in rest.stderr, rest.stderr
        assert not queued(orphan)
        m = sweep_json(sweep)
        assert m["submissions"][-1]["runs"] == [2] and m["runs"]["2"]["job_id"]
        assert len(queue_tasks(all_job_ids(sweep))) == 3  # the first array's 2 tasks and run 2's new one
        again = run_hpctrain(sweep_args(sweep, "1,2,3", HOLD), cwd=tmp_path, timeout=120)  # nothing left to cancel
        assert "cancelled" not in again.stderr and "3 run(s) left alone" in again.stdout, again.stdout
    finally:
        cancel(orphan)
        run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, check=False, timeout=120)
        for j in all_job_ids(sweep):
            cancel(j)


UNPICKLABLE_APP = '''
import threading

import hydra

GUARD = threading.Lock()  # a module global the task closes over: cloudpickle cannot pickle a lock


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    with GUARD:
        return {"loss": float(cfg.get("x", 0.0))}


if __name__ == "__main__":
    main()
'''


def test_a_failed_submission_leaves_the_sweep_dir_usable(tmp_path):
    app = tmp_path / "app.py"
    app.write_text(UNPICKLABLE_APP)
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(app), "-m", "+x=1,2", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"]
    broken = subprocess.run(cmd, cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True, timeout=300)
    assert broken.returncode != 0 and "nothing submitted: the job cannot be pickled" in broken.stderr, broken.stderr
    assert "Traceback" not in broken.stderr
    assert not list((sweep / ".hpctrain").glob("submission-*"))  # nothing half-written left behind

    app.write_text(UNPICKLABLE_APP.replace("GUARD = threading.Lock()", "GUARD = None").replace(
        "    with GUARD:\n        return", "    return"))
    fixed = subprocess.run(cmd, cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert [metrics(d)["status"] for d in run_dirs(sweep)] == ["completed", "completed"]
    assert [metrics(d)["metrics"] for d in run_dirs(sweep)] == [{"loss": 1.0}, {"loss": 2.0}]


USER_MODEL = '''
from torch import nn


class Net(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, WIDTH), nn.Tanh(), nn.Linear(WIDTH, num_classes))

    def forward(self, x):
        return self.body(x)


WIDTH = 8
'''


def test_an_edited_user_module_retrains_completed_runs_from_scratch(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "mymodel.py").write_text(USER_MODEL)
    for cmd in (["init", "-q"], ["add", "mymodel.py"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"]):
        subprocess.run(["git", *cmd], cwd=project, check=True, capture_output=True)
    sweep = tmp_path / "sweep"
    args = ["-m", "+tag=a", "max_steps=20", "log_every=10", "eval_every=0", "ckpt_every=10",
            "model._target_=mymodel.Net", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"]
    env = {"PYTHONPATH": str(project)}
    run_hpctrain(args, cwd=project, env=env, timeout=300)
    (run_dir,) = run_dirs(sweep)
    assert metrics(run_dir)["status"] == "completed"
    same = run_hpctrain(args, cwd=project, env=env, timeout=300)
    assert skipped(same.stdout).endswith(f"skipped 1 run(s), already completed by the same code: {run_dir.name}"), \
        same.stdout

    (project / "mymodel.py").write_text(USER_MODEL.replace("WIDTH = 8", "WIDTH = 12"))  # a changed shape
    edited = run_hpctrain(args, cwd=project, env=env, timeout=300)
    assert f"rerun {run_dir.name} from scratch" in edited.stdout, edited.stdout + edited.stderr
    assert record_kinds(run_dir) == ["submitted", "started", "completed", "submitted", "started", "completed"]
    done = metrics(run_dir)
    assert done["status"] == "completed" and done["step"] == 20
    assert any(k.startswith("train/") for k in done["metrics"]), done["metrics"]  # it trained
    (aside,) = run_dir.glob("checkpoints.before-*")
    assert (aside / "last.pt").exists() and (run_dir / "checkpoints" / "last.pt").exists()
