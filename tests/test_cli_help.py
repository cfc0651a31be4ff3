"""What a newcomer types first: --help names the subcommands and the real config groups, --version is ours."""

import subprocess
import sys

import pytest

from cli_helpers import hpctrain_env

pytestmark = pytest.mark.login


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_lists_the_subcommands_and_the_groups_users_pick(tmp_path, flag):
    proc = _run(flag, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for command in ("status", "report", "cancel", "tensorboard"):
        assert f"python -m hpctrain {command} [SWEEP_DIR]" in proc.stdout
    assert "  model: cnn, gpt, mlp" in proc.stdout
    assert "schema" not in proc.stdout  # the structured-config nodes are not choices


def test_version_is_hpctrains_and_help_of_a_subcommand(tmp_path):
    version = _run("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("hpctrain 0.1.0 (hydra-core "), version.stdout
    report = _run("help", "report", cwd=tmp_path)
    assert report.returncode == 0 and "the sweep's objective" in report.stdout, report.stdout + report.stderr


def test_an_added_key_nothing_reads_is_a_warning_with_the_closest_key(tmp_path):
    proc = _run("-m", "lr=1e-3", "+lerning_rate=3", "+max_tokens=5", "hydra/launcher=local",
                "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("hpctrain: warning: lerning_rate: hpctrain's app does not read this key, so it changes nothing; "
            "did you mean lr?") in proc.stderr
    assert "hpctrain: warning: max_tokens: hpctrain's app does not read this key" in proc.stderr
    assert proc.stderr.count("lerning_rate") == 1  # once per sweep, not per point
