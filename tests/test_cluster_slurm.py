"""cluster.py and the launcher against the real test cluster, through wrappers earlier on PATH that make
squeue/sacct fail now and then (as a busy slurmctld does) and make scontrol print typed GRES with socket
affinity (``gpu:tesla:2(S:0)``), as GPU clusters do."""

import os
import re
import subprocess
import sys

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain
from hpctrain.slurm import parse as slurm_parse, query as slurm
from slurm_helpers import metrics, run_dirs

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]
WRAPPERS = HELPERS / "slurm_wrappers"


@pytest.fixture
def wrapped(tmp_path, monkeypatch) -> dict:
    """PATH with the wrappers first; the environment for subprocesses, also set for this process."""
    bin_dir = tmp_path / "wrapped-bin"
    bin_dir.mkdir()
    for tool, wrapper in (("squeue", "flaky"), ("sacct", "flaky"), ("scontrol", "typed_gres")):
        (bin_dir / tool).symlink_to(WRAPPERS / wrapper)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FLAKY_PATTERN": "offfo"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_typed_gres_is_read_from_the_cluster(wrapped):
    shown = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True).stdout
    assert "Gres=gpu:tesla:2(S:0)" in shown
    parts = slurm.partitions()
    assert parts is not None and parts["debug"].default
    assert [n.gpus for n in parts["debug"].nodes] == [2, 2]
    assert parts["debug"].nodes[0].gres == [slurm_parse.Gres("gpu", "tesla", 2, "0")]


@pytest.mark.parametrize("gpus, refused", [(2, False), (3, True)])
def test_launcher_checks_typed_gres_without_a_traceback(tmp_path, wrapped, gpus, refused):
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.launcher.gpus_per_node={gpus}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path, env=wrapped, check=False, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    if refused:
        assert proc.returncode != 0 and "have at most 2 GPU(s)" in proc.stderr + proc.stdout
    else:
        assert proc.returncode == 0 and "dry run: nothing submitted" in proc.stdout, proc.stderr


def test_node_lists_expand_as_scontrol_does(wrapped):
    for nodelist in ("n[1-2]", "n1,n2", "n[1,2]", "n2"):
        real = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        assert real.returncode == 0
        assert slurm_parse.expand_nodelist(nodelist) == real.stdout.split()


def test_array_limits_of_the_cluster():
    limits = slurm.array_limits()
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    expected = int(next(line.split("=")[1] for line in shown.splitlines() if line.startswith("MaxArraySize")))
    assert limits.max_array_size == expected and limits.tasks_per_array <= expected


def test_failed_squeue_calls_are_unknown_never_gone(wrapped, capsys):
    """FLAKY_PATTERN=offfo: one answer, three failures in a row, one answer."""
    poller = slurm.Poller(lambda: slurm.squeue(["1"]), "squeue")
    answers = [poller.poll() for _ in range(5)]
    assert answers[0] == {} and all(a == {} for a in answers[1:4])  # the last good answer stands
    assert [slurm.squeue(["1"]) for _ in range(5)] == [{}, None, None, None, {}]
    assert "squeue failed 2 times in a row" in capsys.readouterr().err


def test_wait_true_rides_out_failing_squeue_and_sacct(tmp_path, wrapped):
    """A sweep waited for while squeue fails three calls in five: it ends when the runs do, all completed."""
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "max_steps=20", "hydra/launcher=slurm", "hydra.launcher.wait=true",
                         f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=wrapped, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 completed, 0 failed" in proc.stdout
    # piped, the wait prints one line per event it saw in the runs' records: each run's end exactly once
    ends = [line.split()[:2] for line in proc.stdout.splitlines() if re.match(r"  completed +#\d", line)]
    assert sorted(ends) == [["completed", "#0"], ["completed", "#1"]], proc.stdout
    assert "\x1b[" not in proc.stdout
    assert "squeue failed" in proc.stderr and "the last known answer stands" in proc.stderr
    assert [metrics(d)["status"] for d in run_dirs(sweep)] == ["completed", "completed"]
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep)], cwd=tmp_path,
                            env=hpctrain_env(wrapped), capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and status.stdout.splitlines()[-1] == "2 runs: 2 completed", status.stdout
