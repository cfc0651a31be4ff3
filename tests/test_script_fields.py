"""Every field that reaches the job script is data: a newline in a launcher key, value, job name or path, or
an ``env`` name that is not an identifier, is refused up front with one line naming the key, from the
command line and from a sweep file; nothing is written. What is accepted (``$(...)``, backticks) stays
quoted: the dry run's script, run by bash with a stub ``srun`` first on PATH, creates nothing."""

import os
import subprocess
from pathlib import Path

import pytest

from cli_helpers import run_hpctrain

DRY = ["-m", "lr=1e-3,1e-4", "hydra/launcher=slurm", "hydra.launcher.dry_run=true"]


def _cases(marker: Path, sweep: Path):
    bad = f"x\ntouch {marker}"
    return {  # override -> the key the refusal names
        f"hydra.launcher.job_name='{bad}'": "hydra.launcher.job_name=",
        f"+hydra.launcher.additional_parameters.comment='{bad}'": "hydra.launcher.additional_parameters.comment=",
        f"hydra.sweep.dir='{sweep}\ntouch {marker}'": "hydra.sweep.dir=",
        f"hydra.launcher.setup=['{bad}']": "hydra.launcher.setup[0]=",
        f"hydra.launcher.srun_args=['{bad}']": "hydra.launcher.srun_args[0]=",
        f"hydra.launcher.partition='{bad}'": "hydra.launcher.partition=",
        f"+hydra.launcher.env.X='{bad}'": "hydra.launcher.env.X=",
        "+hydra.launcher.env.A$B=1": "hydra.launcher.env.'A$B'",
        "+hydra.launcher.env={A-B: 1}": "hydra.launcher.env.'A-B'",
    }


def _refused(proc: subprocess.CompletedProcess, tmp_path: Path, marker: Path, keys) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("nothing submitted")
    for key in keys:
        assert key in proc.stderr, (key, proc.stderr)
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg"]  # no sweep dir, no multirun.yaml


@pytest.mark.parametrize("case", range(9))
def test_an_injection_on_the_command_line_is_refused_naming_its_key(tmp_path, case):
    (tmp_path / "cfg").mkdir()
    marker, sweep = tmp_path / "PWNED", tmp_path / "sweep"
    override, key = list(_cases(marker, sweep).items())[case]
    sweep_dir = [] if override.startswith("hydra.sweep.dir") else [f"hydra.sweep.dir={sweep}"]
    proc = run_hpctrain(DRY + sweep_dir + [override], cwd=tmp_path, check=False, timeout=60)
    _refused(proc, tmp_path, marker, [key])


SWEEP_FILE = """# @package _global_
hydra:
  job: {{name: "a\\ntouch {m}"}}
  sweep: {{dir: "{s}\\ntouch {m}"}}
  launcher:
    env: {{"A=1; touch {m}; B": 1}}
    additional_parameters: {{"comment\\ntouch {m}": x, comment2: "y\\ntouch {m}"}}
    setup: ["echo hi\\ntouch {m}"]
    srun_args: ["--x\\ntouch {m}"]
    partition: "debug\\ntouch {m}"
  sweeper:
    params: {{lr: "1e-3,1e-4"}}
"""


def test_injections_from_a_colleagues_sweep_file_are_refused_each_naming_its_key(tmp_path):
    marker, sweep = tmp_path / "PWNED", tmp_path / "sweep"
    (tmp_path / "cfg" / "sweep").mkdir(parents=True)
    (tmp_path / "cfg" / "sweep" / "evil.yaml").write_text(SWEEP_FILE.format(m=marker, s=sweep))
    proc = run_hpctrain(["-m", "--config-dir", "cfg", "+sweep=evil", "hydra/launcher=slurm",
                         "hydra.launcher.dry_run=true"], cwd=tmp_path, check=False, timeout=60)
    _refused(proc, tmp_path, marker, ["hydra.sweep.dir=", "hydra.launcher.job_name=", "hydra.launcher.setup[0]=",
                                      "hydra.launcher.srun_args[0]=", "hydra.launcher.partition=",
                                      "hydra.launcher.additional_parameters.'comment\\ntouch",
                                      "hydra.launcher.additional_parameters.comment2=",
                                      f"hydra.launcher.env.'A=1; touch {marker}; B'"])
    assert len(proc.stderr.strip().splitlines()) == 1 + 9  # the header, then one line per problem


def test_the_dry_runs_script_keeps_shell_syntax_as_data(tmp_path):
    marker = tmp_path / "PWNED"
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text("#!/bin/sh\nexit 0\n")
    (stub / "srun").chmod(0o755)
    values = [f"hydra.launcher.job_name='a$(touch {marker})'",
              f"+hydra.launcher.additional_parameters.comment='`touch {marker}`;touch {marker}'",
              f"+hydra.launcher.env.X='$(touch {marker})'"]
    proc = run_hpctrain(DRY + [f"hydra.sweep.dir={tmp_path / 'sweep'}"] + values, cwd=tmp_path, timeout=60)
    script = proc.stdout[proc.stdout.index("#!/bin/bash"):proc.stdout.index("\nruns (")]
    assert f"touch {marker}" in script  # the value is in the script, quoted
    (tmp_path / "job.sh").write_text(script)
    env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert not marker.exists()
