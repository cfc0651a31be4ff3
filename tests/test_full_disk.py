"""A full disk (issue 19, item 18): one line naming the full file system, kept where status finds it, no
temp files left, not retried; the checkpoints stay intact and the same command resumes once there is room.

Real full disks: small tmpfs mounts (the tests run as root), unmounted in a finally.
"""

import json
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from cli_helpers import run_hpctrain
from hpctrain.core import atomic
from hpctrain.core.errors import DiskFullError, deterministic
from slurm_helpers import record_kinds

# the default MLP's checkpoint is ~0.9 MB: the first two fit in 2 MB, the third cannot
RUN = ["max_steps=200", "ckpt_every=50", "eval_every=0", "hydra/launcher=local",
       "hydra.launcher.max_retries=1"]
RUN_NAME = "0_ckpt_every=50,eval_every=0,max_steps=200"


@contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _temp_files(directory: Path):
    return [p for p in directory.rglob("*") if p.is_file() and (".tmp" in p.name or p.name.endswith("save_tmp"))]


def test_an_atomic_write_on_a_full_disk_says_so_and_leaves_no_temp_file(tmp_path):
    with tmpfs(tmp_path / "small", "64k") as d:
        atomic.write_text_atomic(d / "kept.json", "{}")
        with pytest.raises(DiskFullError) as err:
            atomic.write_bytes_atomic(d / "big.bin", b"x" * 200_000)
        assert str(err.value).startswith(f"the file system of {d} is full")
        assert _temp_files(d) == [] and not (d / "big.bin").exists()
        assert (d / "kept.json").read_text() == "{}"


def test_a_checkpoint_on_a_full_disk_says_so_keeps_the_last_one_and_leaves_no_temp_file(tmp_path):
    from hpctrain.train.checkpointer import load, save_atomic

    with tmpfs(tmp_path / "small", "1m") as d:
        path = d / "checkpoints" / "last.pt"
        save_atomic({"step": 1, "w": torch.zeros(100_000)}, path)  # 0.4 MB
        with pytest.raises(DiskFullError) as err:  # torch's zip writer fails ("unexpected pos") under it
            save_atomic({"step": 2, "w": torch.zeros(200_000)}, path)
        assert f"the file system of {path.parent} is full" in str(err.value)
        assert _temp_files(d) == []
        state, source = load(path)
        assert state["step"] == 1 and source == path


def test_a_full_disk_is_not_retried():
    tail = ("OSError: [Errno 28] No space left on device\n\nThe above exception was the direct cause of the "
            "following exception:\n\nhpctrain.core.errors.DiskFullError: the file system of /scratch/x is full")
    assert deterministic(tail)
    assert deterministic("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2\n"
                         "OSError: [Errno 28] No space left on device")
    assert deterministic("OSError: [Errno 122] Disk quota exceeded")
    assert not deterministic("RuntimeError: NCCL error: unhandled system error")


def test_a_run_dir_full_during_a_checkpoint_fails_once_with_the_file_system_named(tmp_path):
    sweep = tmp_path / "sweep"
    run_dir = sweep / RUN_NAME
    with tmpfs(run_dir, "2m"):
        proc = run_hpctrain(["-m", *RUN, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out, out
        said = f"the file system of {run_dir}/checkpoints is full"
        assert "not retried" in out, out  # a full disk stays full: no retry spent on it
        record = json.loads((run_dir / "metrics.json").read_text())
        assert record["status"] == "failed" and said in record["error"].splitlines()[-1]
        assert record_kinds(run_dir).count("started") == 1
        assert _temp_files(run_dir) == []
        status = run_hpctrain(["status", str(sweep)], cwd=tmp_path, timeout=120, check=False).stdout
        assert said in status, status
        logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.err"))
        assert f"hpctrain: run {RUN_NAME} failed: {said}" in logs
        # the checkpoints stayed whole: with room again, the same command resumes and completes
        assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 100
        subprocess.run(["mount", "-o", "remount,size=8m", str(run_dir)], check=True)
        run_hpctrain(["-m", *RUN, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300)
        assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
        assert "resumed from" in (run_dir / "hpctrain.log").read_text()


def _fill_when_saving(run_dir: Path, stop: threading.Event) -> None:
    """Once the first checkpoint is there, fill the file system to its last byte: the next write fails. (Waiting
    for the second checkpoint's temp file missed it when the save took less than the 2 ms poll: the run
    completed and the test failed in CI.)"""
    ckpts = run_dir / "checkpoints"
    while not stop.is_set():
        if (ckpts / "last.pt").exists():
            break
        time.sleep(0.002)
    try:
        with open(run_dir / ".filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass


def test_a_run_dir_at_zero_bytes_free_leaves_the_error_in_the_job_log_and_the_launcher_output(tmp_path):
    sweep = tmp_path / "sweep"
    run_dir = sweep / RUN_NAME
    with tmpfs(run_dir, "4m"):
        stop = threading.Event()
        filler = threading.Thread(target=_fill_when_saving, args=(run_dir, stop), daemon=True)
        filler.start()
        try:
            proc = run_hpctrain(["-m", *RUN, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300, check=False)
        finally:
            stop.set()
            filler.join(10)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out
        said = f"the file system of {run_dir}"
        logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.err"))
        assert f"hpctrain: run {RUN_NAME} failed: {said}" in logs, logs[-3000:]
        assert said in out and "is full" in out, out  # the launcher could not record it: it says so
        assert _temp_files(run_dir) == []
        status = run_hpctrain(["status", str(sweep)], cwd=tmp_path, timeout=120, check=False).stdout
        assert sorted((sweep / ".submitit").glob("*_log.err"))[-1].name in status, status  # where to look


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_on_slurm_a_run_dir_full_during_a_checkpoint_is_said_and_not_retried(tmp_path):
    sweep = tmp_path / "sweep"
    run_dir = sweep / RUN_NAME
    with tmpfs(run_dir, "2m"):
        args = [a for a in RUN if a != "hydra/launcher=local"]
        proc = run_hpctrain(["-m", *args, "hydra/launcher=slurm", "hydra.launcher.wait=true",
                             f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300, check=False)
        said = f"the file system of {run_dir}/checkpoints is full"
        record = json.loads((run_dir / "metrics.json").read_text())
        assert record["status"] == "failed" and said in record["error"].splitlines()[-1], proc.stdout + proc.stderr
        assert record_kinds(run_dir).count("started") == 1  # not retried
        assert _temp_files(run_dir) == []
        logs = "".join(p.read_text(errors="replace") for p in (sweep / ".submitit").rglob("*")
                       if p.is_file() and p.suffix in (".err", ".out"))
        assert f"hpctrain: run {RUN_NAME} failed: {said}" in logs  # the job's own log
        assert "the same error would come back on every attempt, not retried" in logs  # the batch script's
        status = run_hpctrain(["status", str(sweep)], cwd=tmp_path, timeout=120, check=False).stdout
        assert said in status, status
