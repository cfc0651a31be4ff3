"""Any Hydra app on hpctrain's launchers: a user's own ``@hydra.main`` script (tests/helpers/foreign_app.py,
which imports nothing of hpctrain), swept locally and on the test cluster; its return value becomes the
run's metrics; status, report, retries and the rerun that skips completed runs work for it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import HELPERS, hpctrain_env, skipped
from slurm_helpers import metrics, record_kinds, run_dirs

APP = HELPERS / "foreign_app.py"


def sweep_app(args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(APP), "-m", *args], cwd=cwd, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=timeout)


def review(args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=120)


def test_foreign_app_on_local_launcher(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["+x=0,1,3", "+fail_above=2", "hydra/launcher=local", "hydra.launcher.max_retries=1",
            f"hydra.sweep.dir={sweep}"]
    proc = sweep_app(args, tmp_path)
    assert proc.returncode != 0 and "1 of 3 run(s) failed" in proc.stderr, proc.stdout + proc.stderr
    zero, one, three = run_dirs(sweep)
    assert metrics(zero)["status"] == "completed" and metrics(zero)["metrics"] == {"loss": 1.0, "score": -1.0}
    assert metrics(one)["metrics"] == {"loss": 0.0, "score": -0.0}
    failed = metrics(three)
    assert failed["status"] == "failed" and "x=3.0 is above fail_above=2" in failed["error"]
    assert record_kinds(three) == ["submitted", "started", "failed", "retrying", "started", "failed"]

    status = review(["status", str(sweep)], tmp_path)
    assert status.returncode == 1 and status.stdout.splitlines()[-1] == "3 runs: 2 completed, 1 failed"
    report = review(["report", str(sweep), "--metric", "loss", "--mode", "min"], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "best: #1 x=1" in report.stdout and "loss = 0" in report.stdout
    best = json.loads((sweep / "results.json").read_text())["best"]
    assert best["command"].endswith(f"python {APP} +x=1 +fail_above=2"), best["command"]
    by_score = review(["report", str(sweep), "--metric", "score", "--mode", "max"], tmp_path)
    assert "best: #1" in by_score.stdout

    again = sweep_app(args[:1] + ["+fail_above=5"] + args[2:], tmp_path)  # a changed point: only it runs
    assert "skipped 2 run(s)" in skipped(again.stdout) and "0_+x=0, 1_+x=1" in skipped(again.stdout), again.stdout
    assert again.returncode == 0, again.stdout + again.stderr


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=me@example.com", "-c", "user.name=me", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_plain_app_outside_git_is_named_snapshotted_and_reviewed_by_its_own_metrics(tmp_path):
    """Run dirs by swept values, no tb= for logs the app never wrote, the app's directory copied (its code,
    not its data) and run from the copy, status and report on the app's returned metrics."""
    import re
    import shutil

    app_dir, here = tmp_path / "app", tmp_path / "elsewhere"
    app_dir.mkdir(), here.mkdir()
    shutil.copy(APP, app_dir / "app.py")
    (app_dir / "settings.yaml").write_text("a: 1\n")
    (app_dir / "data.bin").write_bytes(b"\0" * 4096)
    sweep = here / "sweep"
    proc = subprocess.run([sys.executable, str(app_dir / "app.py"), "-m", "+x=0,1", "+y=5", "hydra/launcher=local",
                           f"hydra.sweep.dir={sweep}"], cwd=here, env=hpctrain_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [d.name for d in run_dirs(sweep)] == ["0_+x=0", "1_+x=1"]  # +y=5 is the same for all: not in names
    assert "tb=" not in proc.stdout, proc.stdout
    copied = {p.name for p in (sweep / ".hpctrain" / "submission-0" / "code").rglob("*") if str(app_dir) in str(p)}
    assert {"app.py", "settings.yaml"} <= copied and "data.bin" not in copied, copied

    status = review(["status", str(sweep)], here).stdout
    assert re.search(r"^#\s+x\s+state\s+progress\s+loss\s", status, re.M), status
    assert re.search(r"^0\s+x=0\s+completed\s+-\s+1\s", status, re.M), status
    report = review(["report", str(sweep)], here)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "ranked by loss (min)" in report.stdout and re.search(r"^rank\s+#\s+x\s+state\s+loss\s+score\s+elapsed$",
                                                                  report.stdout, re.M), report.stdout
    code = [line for line in report.stdout.splitlines() if line.startswith("code: ")]
    assert code[0] == f"code: {app_dir} (the app's directory; no git work tree, so no commit)", code


def test_a_plain_app_in_its_own_git_tree_names_its_commit_and_keeps_older_run_dirs(tmp_path):
    """The app's own work tree is recorded first (report's code line), launched from outside it; a sweep made
    before run dirs were named by values (0, 1) is rerun into those same dirs."""
    import shutil

    repo, here = tmp_path / "proj", tmp_path / "elsewhere"
    repo.mkdir(), here.mkdir()
    shutil.copy(APP, repo / "app.py")
    _git(repo, "init", "-q")
    _git(repo, "add", "app.py")
    _git(repo, "commit", "-q", "-m", "app")
    commit = _git(repo, "rev-parse", "HEAD")
    sweep = here / "sweep"
    args = [sys.executable, str(repo / "app.py"), "-m", "+x=0,1", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"]
    old = subprocess.run(args + ["hydra.sweep.subdir=${hydra.job.num}"], cwd=here, env=hpctrain_env(),
                         capture_output=True, text=True, timeout=300)  # the names Hydra's own rule gives
    assert old.returncode == 0, old.stdout + old.stderr
    assert [d.name for d in run_dirs(sweep)] == ["0", "1"]
    again = subprocess.run(args, cwd=here, env=hpctrain_env(), capture_output=True, text=True, timeout=300)
    assert skipped(again.stdout).endswith("same code: 0, 1"), again.stdout
    report = review(["report", str(sweep)], here).stdout
    code = [line for line in report.splitlines() if line.startswith("code: ")]
    assert code[0] == f"code: {repo} at commit {commit[:12]}", report


def test_a_returned_number_is_the_metric_value(tmp_path):
    sweep = tmp_path / "sweep"
    proc = sweep_app(["+x=2,4", "+number_only=true", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [metrics(d)["metrics"] for d in run_dirs(sweep)] == [{"value": 1.0}, {"value": 9.0}]
    report = review(["report", str(sweep), "--metric", "value"], tmp_path)
    assert report.returncode == 0 and "best: #0 x=2" in report.stdout, report.stdout + report.stderr


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_foreign_app_on_slurm(tmp_path):
    sweep = tmp_path / "sweep"
    proc = sweep_app(["+x=0,1,3", "hydra/launcher=slurm", "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}"],
                     tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [metrics(d)["metrics"]["loss"] for d in run_dirs(sweep)] == [1.0, 0.0, 4.0]
    report = review(["report", str(sweep), "--metric", "loss", "--mode", "min"], tmp_path)
    assert report.returncode == 0 and "best: #1 x=1" in report.stdout, report.stdout + report.stderr


def test_a_deterministic_error_fails_at_once_and_a_transient_one_is_retried(tmp_path):
    from hpctrain.core.errors import deterministic

    assert deterministic("Traceback ...\nValueError: lr=-1: expected a number > 0")
    assert deterministic("  File x\nIndexError: Target 6 is out of bounds.")
    assert deterministic("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 16x2)")
    assert not deterministic("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not deterministic("torch.OutOfMemoryError: CUDA out of memory")
    assert not deterministic("ValueError: x\nRuntimeError: NCCL communicator was aborted")  # the machine's doing
    assert not deterministic("RuntimeError: Flaky: failing on the first attempt")
    assert not deterministic(None) and not deterministic("the job's tasks ended with exit code 137 (killed, ...)")
    sweep = tmp_path / "sweep"
    proc = sweep_app(["+x=0", "+bad_config=1", "hydra/launcher=local", "hydra.launcher.max_retries=2",
                      f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode != 0
    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert record_kinds(run_dir) == ["submitted", "started", "failed"]  # not retried
    assert "failed with ValueError: bad_config=1: expected nothing here: the same error would come back" in proc.stderr


def _search_an_app_without_max_steps(sweep: Path, launcher: str, cwd: Path) -> subprocess.CompletedProcess:
    """A search over an app whose config has no ``max_steps`` (scheduler none): its workers once died at their
    first trial (``Key 'max_steps' is not in struct``)."""
    return sweep_app(["hydra/sweeper=search", "+x=interval(0,2)", "+number_only=true", "hydra.sweeper.n_trials=4",
                      "hydra.sweeper.n_workers=2", f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}",
                      *(["hydra.launcher.max_parallel=2"] if launcher == "local" else [])], cwd)


def _trials_completed(sweep: Path) -> list:
    import optuna

    study = optuna.load_study(study_name="search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(sweep / ".hpctrain" / "study.journal"))))
    return [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def test_a_search_over_an_app_without_max_steps_runs_its_trials_locally(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _search_an_app_without_max_steps(sweep, "local", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "max_steps" not in proc.stdout + proc.stderr
    assert len(_trials_completed(sweep)) == 4, proc.stdout + proc.stderr
    assert re.search(r"\[4/4 done, 0 running, 0 failed\]$", proc.stdout, re.M), proc.stdout


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_search_over_an_app_without_max_steps_runs_its_trials_on_slurm(tmp_path):
    from slurm_helpers import cancel, job_id, queued, wait_for

    sweep = tmp_path / "sweep"
    proc = _search_an_app_without_max_steps(sweep, "slurm", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = job_id(sweep)
    try:
        wait_for(lambda: not queued(job), 300, "the workers to finish the study")
        logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
        assert "is not in struct" not in logs, logs[-2000:]
        assert len(_trials_completed(sweep)) == 4, logs[-2000:]
    finally:
        cancel(job)
