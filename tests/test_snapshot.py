"""The code snapshot taken at submit time, and the record of what ran (hpctrain/submit/snapshot.py, provenance.py).

A user's project is a temporary git repository used as the launch directory, holding a model module
whose behaviour (the VERSION it writes down when built) is changed after submitting: the runs must
write the version of submit time, from the copy in the sweep dir.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import HELPERS, run_hpctrain
from container_helpers import sandbox_image, standin_bin
from isolation import MODES, mode_for, ran_contained
from slurm_helpers import cancel, job_id, metrics, queued, run_dirs, wait_for

MODULE = '''
import time
from pathlib import Path

from torch import nn

VERSION = "{version}"


class Net(nn.Module):
    """Writes VERSION and where this module was imported from, each time it is built (each attempt)."""

    def __init__(self, in_features, num_classes, out_dir, delay_s=0.0):
        super().__init__()
        self.body = nn.Linear(in_features, num_classes)
        self.delay_s = delay_s
        with open(Path(out_dir) / "versions.txt", "a") as f:
            f.write(f"{{VERSION}} {{__file__}}\\n")

    def forward(self, x):
        time.sleep(self.delay_s)  # a steady pace, so that a test can preempt the run half-way
        return self.body(x)
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def set_version(repo: Path, version: str) -> None:
    (repo / "mynet.py").write_text(MODULE.format(version=version))  # in place: no new inode


@pytest.fixture
def project(tmp_path) -> Path:
    """A git repository with mynet.py committed as "committed", then edited (not committed) to "old"."""
    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    set_version(repo, "committed")
    git(repo, "add", "mynet.py")
    git(repo, "commit", "-q", "-m", "first")
    set_version(repo, "old")
    (tmp_path / "out").mkdir()
    return repo


def versions(out: Path) -> list:
    path = out / "versions.txt"
    return [line.split(" ", 1) for line in path.read_text().splitlines()] if path.exists() else []


def model_args(out: Path, delay_s: float = 0.0) -> list:
    return ["model._target_=mynet.Net", f"+model.out_dir={out}", f"+model.delay_s={delay_s}", "eval_every=0",
            "ckpt_every=0", "log_every=20"]


def check_record(sweep: Path, repo: Path) -> dict:
    """The submission's record names the project's commit and holds its uncommitted change."""
    record = json.loads((sweep / ".hpctrain" / "submission-0" / "record.json").read_text())
    (proj,) = [r for r in record["repositories"] if r["root"] == str(repo)]
    assert proj["commit"] == git(repo, "rev-parse", "HEAD") and proj["dirty"]
    diff = (sweep / ".hpctrain" / "submission-0" / proj["diff_file"]).read_text()
    assert '-VERSION = "committed"' in diff and '+VERSION = "old"' in diff, diff
    assert record["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert record["hpctrain_version"] and record["distributions"]["hydra-core"]
    assert "model._target_=mynet.Net" in record["argv"]
    return record


@pytest.mark.slurm
@pytest.mark.parametrize("mode_name", MODES)
def test_held_sweep_runs_the_code_of_submit_time_also_after_a_requeue(slurm_cluster, project, tmp_path, mode_name):
    """Bare, and inside a container that hides Slurm from the job (issue 27): the image runs the snapshot."""
    mode = mode_for(mode_name, tmp_path)
    out, sweep = tmp_path / "out", project / "multirun" / "s1"  # the sweep dir inside the work tree
    run_hpctrain(["-m", "max_steps=20,1500", *model_args(out, delay_s=0.005), "hydra/launcher=slurm",
                  "+hydra.launcher.additional_parameters.hold=true", f"hydra.sweep.dir={sweep}", *mode.args],
                 cwd=project, timeout=60, env=mode.env)
    job = job_id(sweep)
    try:
        set_version(project, "new")  # the user goes on editing while the sweep waits in the queue
        subprocess.run(["scontrol", "release", job], check=True, timeout=30)
        long_run = sweep / "1_max_steps=1500"
        wait_for(lambda: metrics(long_run).get("step", 0) >= 100, 120, "the long run to be under way")
        set_version(project, "newer")  # edited again before the requeued attempt starts
        subprocess.run(["scancel", "--signal=USR2", "--full", f"{job}_1"], check=True, timeout=30)
        wait_for(lambda: metrics(long_run).get("status") == "requeued", 60, "the checkpoint on USR2")
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in (sweep / "0_max_steps=20", long_run)),
                 240, "both runs to complete")
        assert "resumed from" in (long_run / "hpctrain.log").read_text()
        code = sweep / ".hpctrain" / "submission-0" / "code"
        seen = versions(out)
        assert len(seen) == 3, seen  # the short run, the long run's two attempts
        assert all(v == "old" for v, _ in seen), seen
        assert all(path == str(code) + str(project / "mynet.py") for _, path in seen), seen
        assert not (code / str(project / "multirun").lstrip("/")).exists(), "the sweep dir was copied into itself"
        if mode.contained:  # the record names the image, not this environment's distributions
            record = json.loads((sweep / ".hpctrain" / "submission-0" / "record.json").read_text())
            assert record["distributions"] is None and record["container_image"]
        else:
            record = check_record(sweep, project)
        assert record["job_ids"] == [job]
        wait_for(lambda: not queued(job), 30, "the array to leave the queue")
        assert ran_contained(tmp_path) == mode.contained
    finally:
        cancel(job)


def test_local_sweep_runs_the_snapshot_and_report_reruns_it(project, tmp_path):
    out, sweep = tmp_path / "out", tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3", "max_steps=5", *model_args(out), "hydra/launcher=local",
                         f"hydra.sweep.dir={sweep}"], cwd=project, timeout=300)
    code = sweep / ".hpctrain" / "submission-0" / "code"
    assert f"to {code}" in proc.stderr and "code snapshot:" in proc.stderr
    assert versions(out) == [["old", str(code) + str(project / "mynet.py")]]
    check_record(sweep, project)

    set_version(project, "new")
    report = run_hpctrain(["report", str(sweep)], cwd=project, timeout=120).stdout
    assert f"{project} at commit {git(project, 'rev-parse', 'HEAD')[:12]} with local changes" in report, report
    command = next(line for line in report.splitlines() if line.startswith("reproduce: "))[len("reproduce: "):]
    assert str(code) in command
    # the printed command reruns the run with the code of submit time, though the module has changed since
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(["bash", "-c", command + f" hydra.run.dir={tmp_path / 'rerun'}"], cwd=project, env=env,
                   check=True, capture_output=True, timeout=300)
    assert versions(out)[-1] == ["old", str(code) + str(project / "mynet.py")]

    # hydra.launcher.snapshot=false: the live tree, as before
    proc = run_hpctrain(["-m", "lr=1e-3", "max_steps=5", *model_args(out), "hydra/launcher=local",
                         "hydra.launcher.snapshot=false", f"hydra.sweep.dir={tmp_path / 'live'}"], cwd=project,
                        timeout=300)
    assert "no code snapshot" in proc.stderr
    assert versions(out)[-1] == ["new", str(project / "mynet.py")]
    assert not (tmp_path / "live" / ".hpctrain" / "submission-0" / "code").exists()


def test_large_file_refused_and_named_venv_left_out(project, tmp_path):
    (project / "weights.bin").write_bytes(b"\0" * (3 << 20))  # untracked, not ignored
    venv = project / "env"  # a virtual environment nobody git-ignored
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "big.so").write_bytes(b"\0" * (5 << 20))
    sweep = tmp_path / "sweep"
    args = ["-m", "lr=1e-3", "max_steps=5", *model_args(tmp_path / "out"), "hydra/launcher=local",
            "hydra.launcher.snapshot.max_mb=4", f"hydra.sweep.dir={sweep}"]
    proc = run_hpctrain(args, cwd=project, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "nothing submitted" in out and "hydra.launcher.snapshot.max_mb=4" in out, out
    assert f"hydra.launcher.snapshot: {project / 'weights.bin'} (3.0 MB)" in out, out
    assert "big.so" not in out, "the virtual environment was counted"
    assert not (sweep / ".submitit").exists() and not (sweep / ".hpctrain").exists()

    (project / ".gitignore").write_text("*.bin\n")
    proc = run_hpctrain(args + ["hydra.launcher.dry_run=true"], cwd=project, timeout=120)
    assert f"left out of the code snapshot (virtual environments, run outputs; add them to .gitignore): {venv}" \
        in proc.stderr, proc.stderr
    assert f"would copy to {sweep / '.hpctrain' / 'submission-0' / 'code'}" in proc.stderr


def test_the_launchs_own_sweep_dir_is_no_gitignore_advice(project, tmp_path):
    """Hydra makes the sweep dir (./multirun/DATE/TIME, not git-ignored here) before the snapshot is planned:
    it is left out, and not named as something to add to .gitignore (issue 29 item 8)."""
    args = ["-m", "lr=1e-3,1e-4", "max_steps=5", *model_args(tmp_path / "out"), "hydra/launcher=local",
            "hydra.launcher.dry_run=true"]
    proc = run_hpctrain(args, cwd=project, timeout=120)
    assert "add them to .gitignore" not in proc.stderr, proc.stderr
    assert "would copy to" in proc.stderr, proc.stderr


def test_listed_paths_outside_git_are_copied_and_the_launcher_says_so(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mynet.py").write_text(MODULE.format(version="listed"))
    work = tmp_path / "work"  # not a git work tree
    work.mkdir()
    (tmp_path / "out").mkdir()
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3", "max_steps=5", *model_args(tmp_path / "out"), "hydra/launcher=local",
                         f"hydra.launcher.snapshot.paths=[{lib}]", f"hydra.sweep.dir={sweep}"], cwd=work,
                        env={"PYTHONPATH": os.pathsep.join([str(lib), str(HELPERS)])}, timeout=300)
    assert f"{work} is not in a git work tree" in proc.stderr
    code = sweep / ".hpctrain" / "submission-0" / "code"
    assert versions(tmp_path / "out") == [["listed", str(code) + str(lib / "mynet.py")]]


def test_container_job_imports_the_snapshot_ahead_of_the_image(project, tmp_path):
    """Through `apptainer exec` (the bubblewrap stand-in, the test image): the snapshot reaches the container
    via APPTAINERENV_*, and only the image and its binds are seen there."""
    bin_dir = standin_bin(tmp_path)
    image = tmp_path / "img"
    image.symlink_to(sandbox_image())
    out, sweep = tmp_path / "out", tmp_path / "sweep"
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    run_hpctrain(["-m", "lr=1e-3", "max_steps=5", *model_args(out), "hydra/launcher=local",
                  f"hydra.launcher.container.image={image}", f"hydra.sweep.dir={sweep}"], cwd=project,
                 env={"PATH": path}, timeout=300)
    code = sweep / ".hpctrain" / "submission-0" / "code"
    assert versions(out) == [["old", str(code) + str(project / "mynet.py")]]
    record = json.loads((sweep / ".hpctrain" / "submission-0" / "record.json").read_text())
    assert record["container_image"]["path"] == str(image) and record["container_image"]["bytes"] == image.stat().st_size
    assert record["distributions"] is None  # the image's packages ran, not this environment's
    assert record["job_python"].startswith("apptainer exec")


APP = '''
import hydra


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    return {"value": float(cfg.value)}


if __name__ == "__main__":
    main()
'''


@pytest.mark.slurm
def test_held_script_app_composes_the_yaml_of_submit_time(slurm_cluster, tmp_path):
    """Any Hydra app, run as `python app.py`: its config directory is read from the snapshot too."""
    repo = tmp_path / "app"
    (repo / "conf").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "app.py").write_text(APP)
    (repo / "conf" / "config.yaml").write_text("value: 1\n")
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "app.py", "-m", "+x=1,2", "hydra/launcher=slurm",
                           "+hydra.launcher.additional_parameters.hold=true", f"hydra.sweep.dir={sweep}"],
                          cwd=repo, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = job_id(sweep)
    try:
        (repo / "conf" / "config.yaml").write_text("value: 2\n")
        subprocess.run(["scontrol", "release", job], check=True, timeout=30)
        wait_for(lambda: not queued(job), 120, "the array to end")
        assert len(run_dirs(sweep)) == 2
        for run_dir in run_dirs(sweep):
            assert (run_dir / ".hydra" / "config.yaml").read_text().startswith("value: 1\n")
        record = json.loads((sweep / ".hpctrain" / "submission-0" / "record.json").read_text())
        (proj,) = [r for r in record["repositories"] if r["root"] == str(repo)]
        assert proj["commit"] is None and {u["path"] for u in proj["untracked"]} == {"app.py", "conf/config.yaml"}
    finally:
        cancel(job)


def test_settings_accept_false_or_the_keys_and_name_what_is_wrong():
    from hpctrain.submit.snapshot import SnapshotOptions, read_options

    assert read_options(False) == (None, [])
    assert read_options({"enabled": False, "paths": [], "max_mb": 50}) == (None, [])
    assert read_options({"enabled": True, "paths": ["lib"], "max_mb": 5}) == (SnapshotOptions(True, ["lib"], 5.0), [])
    assert read_options({"max_mb": 0})[1] == ["hydra.launcher.snapshot.max_mb=0: expected a number > 0"]
    assert read_options({"paths": "lib"})[1] == ["hydra.launcher.snapshot.paths='lib': expected a list of paths"]
    assert read_options("yes")[1][0].startswith("hydra.launcher.snapshot='yes': expected false")


def test_left_out_virtual_environments_outputs_and_bytecode():
    from hpctrain.submit.snapshot import _keep

    names = ["a.py", "pkg/__pycache__/a.cpython-311.pyc", "pkg/b.pyc", ".venv/pyvenv.cfg", ".venv/lib/x.py",
             "conda/conda-meta/history", "conda/lib/y.py", "multirun/d/t/multirun.yaml", "multirun/d/t/0/m.json",
             "outputs/d/t/.hydra/config.yaml", "outputs/d/t/log.txt", "sub/.hpctrain/events/0.jsonl", "sub/c.py"]
    kept, dropped = _keep(names)
    assert kept == ["a.py"]
    assert dropped == [".venv", "conda", "multirun/d/t", "outputs/d/t", "sub"]


def _work_tree(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "model.py").write_text("X = 1\n")
    (root / "notes.swp").write_text("editor swap file\n")  # untracked, not ignored
    return root


def test_a_file_that_vanishes_between_listing_and_copying_is_left_out_and_said(tmp_path, monkeypatch):
    from hpctrain.submit import snapshot

    repo = _work_tree(tmp_path / "proj")
    monkeypatch.setattr(snapshot, "hpctrain_checkout", lambda: None)
    snap = snapshot.plan(snapshot.SnapshotOptions(True, [], 50.0), repo, tmp_path / "code")
    assert str(repo / "notes.swp") in snap.files and not snap.problems
    (repo / "notes.swp").unlink()
    snap.take()
    assert (tmp_path / "code" / str(repo / "model.py").lstrip("/")).read_text() == "X = 1\n"
    assert str(repo / "notes.swp") not in snap.files
    assert snap.notes[-1] == f"1 file(s) vanished between listing and copying, left out: {repo / 'notes.swp'}"


def test_a_git_that_hangs_is_one_problem_not_a_traceback(tmp_path, monkeypatch):
    from hpctrain.submit import snapshot

    repo = _work_tree(tmp_path / "proj")
    real_git = subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(f'#!/bin/sh\ncase "$*" in *ls-files*) exec sleep 30;; esac\nexec {real_git} "$@"\n')
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(snapshot, "GIT_TIMEOUT_S", 1)
    monkeypatch.setattr(snapshot, "hpctrain_checkout", lambda: None)
    snap = snapshot.plan(snapshot.SnapshotOptions(True, [], 50.0), repo, tmp_path / "code")
    assert snap.problems == [f"code snapshot of {repo}: `git ls-files -z --cached --others --exclude-standard` "
                             f"in {repo} gave no answer within 1 s"]
