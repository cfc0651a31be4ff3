"""Never overwrite, never lose; values are data, secrets stay out of files."""

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from cli_helpers import hpctrain_env, run_hpctrain, skipped


def _snapshot(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in run_dir.rglob("*") if p.is_file()}


def test_rerun_of_half_failed_sweep_keeps_completed_runs(tmp_path):
    marker = tmp_path / "marker"
    marker.mkdir()
    sweep = tmp_path / "sweep"
    args = ["-m", "model._target_=user_models.TinyNet,user_models.Flaky", f"+model.marker_dir={marker}",
            "max_steps=30", "hydra/launcher=local", "hydra.launcher.max_retries=0", f"hydra.sweep.dir={sweep}"]
    first = run_hpctrain(args, cwd=tmp_path, check=False)
    assert first.returncode != 0 and "1 of 2 run(s) failed" in first.stderr
    done, failed = sweep / "0_model._target_=user_models.TinyNet", sweep / "1_model._target_=user_models.Flaky"
    assert json.loads((failed / "metrics.json").read_text())["status"] == "failed"
    before = _snapshot(done)

    second = run_hpctrain(args, cwd=tmp_path)
    assert done.name in skipped(second.stdout), second.stdout
    assert _snapshot(done) == before  # same files, same sizes, same mtimes
    assert json.loads((failed / "metrics.json").read_text())["status"] == "completed"
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert [s["runs"] for s in manifest["submissions"]] == [[0, 1], [1]]


def test_kill_during_checkpoint_save_resumes_from_previous(tmp_path):
    run_dir = tmp_path / "run"
    # a model big enough that writing its checkpoint takes a while
    args = ["max_steps=40", "ckpt_every=10", "log_every=10", "eval_every=0", "model.hidden=1536", "model.depth=3",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *args], cwd=tmp_path, env=hpctrain_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt_dir = run_dir / "checkpoints"
    deadline = time.time() + 120
    caught = False
    while time.time() < deadline and proc.poll() is None:
        # the second save (step 20) is under way while its temp file exists and last.pt is the step-10 one
        if (ckpt_dir / "last.pt").exists() and list(ckpt_dir.glob(".last.pt.tmp-*")):
            proc.send_signal(signal.SIGKILL)
            caught = True
            break
        time.sleep(0.001)
    proc.wait()
    assert caught, "never saw a checkpoint being written"
    assert list(ckpt_dir.glob(".last.pt.tmp-*")), "the half-written file should still be there"
    previous = torch.load(ckpt_dir / "last.pt", weights_only=True)["step"]  # loads: not truncated
    assert previous in (10, 20, 30)

    run_hpctrain(args, cwd=tmp_path)
    assert f"resumed from {ckpt_dir / 'last.pt'} at step {previous}" in (run_dir / "hpctrain.log").read_text()
    assert torch.load(ckpt_dir / "last.pt", weights_only=True)["step"] == 40
    assert not list(ckpt_dir.glob(".last.pt.tmp-*"))  # the partial file was cleaned up


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_shell_metacharacters_are_data_on_slurm(tmp_path):
    sweep = tmp_path / "a b;$(touch pwned1)`touch pwned2`"
    note = "x y;$(touch pwned3) && touch pwned4 | 'q'"
    proc = run_hpctrain(["-m", "max_steps=5", f"+note={json.dumps(note)}", "hydra/launcher=slurm",
                         "hydra.launcher.wait=true", "hydra.launcher.job_name='n;touch pwned5'",
                         f"hydra.sweep.dir={json.dumps(str(sweep))}"], cwd=tmp_path, timeout=180)
    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed", proc.stdout
    assert f"note: {note}\n" in (run_dir / ".hydra" / "config.yaml").read_text()  # the value, verbatim
    assert "--job-name='n;touch pwned5'" in next((sweep / ".submitit").glob("*submission.sh")).read_text()
    assert not list(Path("/").glob("pwned*")) and not list(tmp_path.rglob("pwned*"))
    assert not list(Path.cwd().glob("pwned*"))


def test_secret_environment_never_reaches_the_sweep_dir(tmp_path):
    secret = f"s3cr3t-{uuid.uuid4().hex}"  # made here: the code snapshot in the sweep dir holds this file
    sweep = tmp_path / "sweep"
    # also read into the config through an interpolation, as a user wiring a logger would
    run_hpctrain(["-m", "max_steps=5", "+auth=${oc.env:MY_API_TOKEN}", "hydra/launcher=local",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                 env={"MY_API_TOKEN": secret, "HF_TOKEN": secret, "DB_PASSWORD": secret})
    leaked = [p for p in sweep.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert list(sweep.rglob("metrics.json"))  # the sweep did run and write its files
    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["config"]["auth"] == "<redacted>"  # the checkpoint's copy of the config says so
