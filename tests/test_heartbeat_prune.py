"""A watchdog killed outright (srun at a time limit, scancel) leaves its attempt's heartbeat dir in /dev/shm,
which is memory. The next attempt of the same run on the same node removes those; other runs', other nodes',
another user's, a link and a dir whose rank still lives are left alone."""

import os
import struct
import subprocess
import sys
from pathlib import Path

from hpctrain.job import heartbeat

OTHER = 65534  # nobody: the test runs as root and plays another user by chown
DIGEST = "0123456789abcdef"


def _attempt(root: Path, name: str, pid: int) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    beat = struct.pack(heartbeat._FORMAT, *([0] * heartbeat.SLOTS))
    slots = list(struct.unpack(heartbeat._FORMAT, beat))
    slots[heartbeat.PID] = pid
    (d / f"rank0-{pid}.beat").write_bytes(struct.pack(heartbeat._FORMAT, *slots))
    return d


def test_the_next_attempt_removes_only_this_runs_dead_attempts_on_this_node(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    root = tmp_path / "hpctrain-0"
    root.mkdir(mode=0o700)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)
    earlier = _attempt(root, f"{DIGEST}-41_0-r0-n1", dead)
    requeued = _attempt(root, f"{DIGEST}-42_0-r1-n1", dead)
    live = _attempt(root, f"{DIGEST}-40_0-r0-n1", os.getpid())  # a rank of it still runs: not over
    other_run = _attempt(root, "fedcba9876543210-42_0-r0-n1", dead)
    other_node = _attempt(root, f"{DIGEST}-42_0-r0-n2", dead)
    suffix_node = _attempt(root, f"{DIGEST}-42_0-r0-xn1", dead)  # a node whose name ends like this one's
    planted = _attempt(root, f"{DIGEST}-39_0-r0-n1", dead)
    os.chown(planted, OTHER, OTHER)
    target = tmp_path / "yours"
    target.mkdir()
    (target / "keep").write_text("x")
    link = root / f"{DIGEST}-38_0-r0-n1"
    link.symlink_to(target)

    ours = root / f"{DIGEST}-42_0-r0-n1"
    heartbeat.mark_watched(ours)

    assert not earlier.exists() and not requeued.exists()
    for kept in (live, other_run, other_node, suffix_node, planted, ours):
        assert kept.is_dir(), kept
    assert link.is_symlink() and (target / "keep").read_text() == "x"
    assert (ours / heartbeat.WATCHED).exists()
