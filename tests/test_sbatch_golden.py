"""Golden file: the sbatch script (and run list) a dry run prints for a typical GPU sweep in Apptainer.

Machine-specific paths become placeholders (<TMP>, <PYTHON>, <REPO>) before the comparison.
Rewrite the golden file after an intended change with:

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_sbatch_golden.py

The request fits the test cluster's nodes (2 CPUs, 2 GPUs, 3.9 GB each), because the launcher checks
it against the partition (scontrol) before printing, and the printed script is then handed to
`sbatch --test-only`, so Slurm itself accepts it. tests/test_container.py checks that the script a dry
run prints is the one a real submission writes.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import ROOT, run_hpctrain

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra

GOLDEN = ROOT / "tests" / "golden" / "sbatch_gpu_sweep.txt"
SWEEP = ["-m", "lr=1e-3,3e-4", "seed=0,1", "max_steps=100", "hydra/launcher=slurm",
         "hydra.launcher.gpus_per_node=2", "hydra.launcher.nodes=1", "hydra.launcher.partition=debug",
         "hydra.launcher.timeout_min=120", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=3",
         "hydra.launcher.dry_run=true"]


def normalize(text: str, tmp_path: Path) -> str:
    """Replace the paths of this machine and this test run by placeholders, longest first."""
    subs = {}
    for path, name in ((tmp_path, "<TMP>"), (Path(sys.executable).parent, "<PYTHON_BIN>"), (ROOT, "<REPO>")):
        subs[str(path)] = name
        subs[str(Path(path).resolve())] = name
    subs[sys.executable] = "<PYTHON>"
    for old in sorted(subs, key=len, reverse=True):
        text = text.replace(old, subs[old])
    return text


@pytest.fixture
def dry_run(slurm_cluster, tmp_path):
    image = tmp_path / "hpctrain.sif"
    image.touch()
    proc = run_hpctrain(SWEEP + [f"hydra.launcher.container.image={image}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path, timeout=60)
    assert not (tmp_path / "sweep" / ".submitit").exists(), "a dry run submitted something"
    return proc.stdout, tmp_path


@pytest.mark.slurm
def test_dry_run_matches_golden(dry_run):
    stdout, tmp_path = dry_run
    text = normalize(stdout, tmp_path)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file: run with UPDATE_GOLDEN=1 to write {GOLDEN}"
    expected = GOLDEN.read_text()
    assert text == expected, (f"the dry run's output changed; if intended, rewrite {GOLDEN.name} with "
                              f"UPDATE_GOLDEN=1\n--- got ---\n{text}")


@pytest.mark.slurm
def test_dry_run_script_makes_sense_and_slurm_accepts_it(dry_run):
    stdout, tmp_path = dry_run
    script, runs = stdout.split("\nruns (", 1)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = {m[1]: m[2] for m in (re.match(r"#SBATCH --([\w-]+)=(.*)$", line) for line in lines) if m}
    assert re.fullmatch(r"0-3%\d+", sbatch["array"]), sbatch  # 4 points, one array
    assert int(sbatch["array"].split("%")[1]) >= 1
    assert sbatch["gpus-per-node"] == "2"
    assert sbatch["ntasks-per-node"] == "2"  # one DDP rank per GPU by default
    assert sbatch["nodes"] == "1" and sbatch["partition"] == "debug" and sbatch["time"] == "120"
    assert sbatch["cpus-per-task"] == "1" and sbatch["mem"] == "3GB"
    assert sbatch["signal"] == "USR2@90"  # checkpoint and requeue 90 s before the limit
    assert sbatch["open-mode"] == "append"  # a requeued run appends to its logs
    # every line of the golden file's header has a meaning asserted here: no unexplained key
    assert set(sbatch) == {"array", "cpus-per-task", "error", "gpus-per-node", "job-name", "mem", "nodes",
                           "ntasks-per-node", "open-mode", "output", "partition", "signal", "time", "wckey"}
    folder = tmp_path / "sweep" / ".submitit"
    assert sbatch["output"] == f"{folder}/%A_%a_0_log.out" and sbatch["error"] == f"{folder}/%A_%a_0_log.err"
    assert sbatch["job-name"] == "hpctrain"  # hydra.job.name
    # the code snapshot of this submission comes first on the path, in the job and in the image
    exports = dict(re.findall(r"^export (\w+)=(.*)$", script, re.M))
    snapshot = tmp_path / "sweep" / ".hpctrain" / "submission-0" / "code"
    assert f"{snapshot}{ROOT}" in exports["PYTHONPATH"] and exports["PYTHONSAFEPATH"] == "1"
    assert exports["APPTAINERENV_PYTHONPATH"] == '"$PYTHONPATH"' and exports["SUBMITIT_EXECUTOR"] == "slurm"
    # the USR2 trap is in the setup, before the job step starts
    setup = script.split("# setup\n", 1)[1].split("# command\n", 1)[0]
    assert re.search(r"^trap .* USR2$", setup, re.M), setup
    # the host side's helper (issue 27): the job's Slurm calls are made by the batch shell, outside the image
    assert re.search(r"^trap .* TERM$", setup, re.M), setup
    assert 'export HPCTRAIN_HOST_DIR="$hpctrain_host" APPTAINERENV_HPCTRAIN_HOST_DIR="$hpctrain_host"' in setup
    assert "scontrol requeue" in setup and "scontrol show job -o" in setup and "squeue -h -r -j" in setup
    for line in lines:
        if "apptainer exec" in line:
            assert not re.search(r"\b(scontrol|squeue|sbatch|scancel)\b", line.split("apptainer exec", 1)[1]), line
    (srun,) = [line for line in lines if line.startswith("srun ")]
    argv = shlex.split(srun)
    i = argv.index("apptainer")
    assert argv[i:i + 3] == ["apptainer", "exec", "--nv"]
    # srun: one log per task, the whole step ends when a rank dies, each task gets its CPUs
    assert argv[1:i] == ["--unbuffered", "--output", f"{folder}/%A_%a_%t_log.out", "--error",
                         f"{folder}/%A_%a_%t_log.err", "--kill-on-bad-exit=1", "--cpus-per-task=1"]
    binds = [argv[j + 1] for j in range(i, len(argv)) if argv[j] == "--bind"]
    assert binds == [str((tmp_path / "sweep").resolve()), str(tmp_path.resolve()), "/dev/shm"]
    image_at = argv.index(str(tmp_path / "hpctrain.sif"))
    assert argv[image_at + 1:] == ["python", "-u", "-m", "submitit.core._submit", str(tmp_path / "sweep" / ".submitit")]
    assert runs.startswith("4 to submit") and "dry run: nothing submitted" in runs
    listed = [line.split() for line in runs.splitlines()[1:] if line.strip() and line.split()[0].isdigit()]
    assert listed == [[str(i), str(tmp_path / "sweep" / name)] for i, name in
                      enumerate(["0_lr=0.001,seed=0", "1_lr=0.001,seed=1", "2_lr=0.0003,seed=0", "3_lr=0.0003,seed=1"])]
    # teardown: the batch shell records how the step ended (run file, array index, exit code), in the image
    teardown = script.split("# teardown\n", 1)[1]
    ended = shlex.split(teardown.splitlines()[1])
    assert ended[ended.index("-m") + 1:] == ["hpctrain.job.attempt_ended",
                                             str(tmp_path / "sweep" / ".hpctrain" / "submission-0.runs.json"),
                                             "${SLURM_ARRAY_TASK_ID:-0}", "$hpctrain_rc", "1", "||", "echo",
                                             "hpctrain: recording how the attempt ended failed (exit code $?)", ">&2"]
    assert teardown.splitlines()[2] == 'exit "$hpctrain_rc"'  # the job's exit code is its step's

    # Slurm itself accepts the script (validated by the controller, nothing queued)
    path = tmp_path / "job.sh"
    path.write_text(script + "\n")
    check = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "to start at" in check.stderr, check.stderr


@pytest.mark.slurm
def test_account_qos_constraint_exclude_and_additional_parameters_reach_the_script(slurm_cluster, tmp_path):
    proc = run_hpctrain(["-m", "max_steps=10", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         "hydra.launcher.account=proj42", "hydra.launcher.qos=high", "hydra.launcher.constraint=a100",
                         "hydra.launcher.exclude=n2", "+hydra.launcher.additional_parameters.begin=now+60",
                         "+hydra.launcher.additional_parameters.mail_type=END", "hydra.launcher.timeout_min=90",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, timeout=60)
    script = proc.stdout.split("\nruns (", 1)[0]
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))
    assert sbatch["account"] == "proj42" and sbatch["qos"] == "high"
    assert sbatch["constraint"] == "a100" and sbatch["exclude"] == "n2"
    assert sbatch["begin"] == "now+60" and sbatch["mail-type"] == "END"
    assert sbatch["time"] == "90"
