"""status and report agree: the same objective for an app that declares none (issue 29 item 6); status fits
the terminal, report prints its table to stdout as CSV, Markdown or JSON (item 8)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import hpctrain_env

APP = '''
import hydra

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    x = float(cfg.x)
    return {"val/accuracy": x / 4, "val/loss": (x - 1.0) ** 2}

if __name__ == "__main__":
    main()
'''


def review(args, cwd: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(env),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("plain")
    (where / "plain_app.py").write_text(APP)
    done = subprocess.run([sys.executable, "plain_app.py", "-m", "+x=0,1,3", "hydra/launcher=local",
                           f"hydra.sweep.dir={where / 's'}"], cwd=where, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "s"


def test_status_and_report_rank_a_plain_app_by_the_same_objective(sweep):
    shown = json.loads(review(["status", str(sweep), "--json"], sweep.parent).stdout)
    assert shown["objective"] == {"metric": "val/loss", "mode": "min"}
    assert [r["objective"] for r in shown["runs"]] == [1.0, 0.0, 4.0]
    table = review(["status", str(sweep)], sweep.parent, {"COLUMNS": "200"}).stdout
    assert "val/loss (min)" in table, table
    report = review(["report", str(sweep)], sweep.parent)
    assert report.returncode == 0 and "best: #1" in report.stdout and "val/loss" in report.stdout, report.stdout
