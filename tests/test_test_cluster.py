"""slurm/test-cluster.sh itself: `start` after one node's slurmd died restarts that one and reports success."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = Path(os.environ.get("HPCTRAIN_SLURM_DIR", "/tmp/hpctrain-slurm"))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slurm
def test_start_after_one_slurmd_died_restarts_it_and_says_up(slurm_cluster):
    pid_file = STATE_DIR / "slurmd-n2.pid"
    old = int(pid_file.read_text())
    os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _alive(old) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(old)
    proc = subprocess.run(["bash", str(ROOT / "slurm" / "test-cluster.sh"), "start"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test-cluster: up in" in proc.stdout
    assert int(pid_file.read_text()) != old
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True).stdout.split("\n")
    assert {line.split()[1] for line in states if line.strip()} <= {"idle", "mix", "alloc"}, states
