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


def _on_a_terminal(args, cwd: Path, columns: int) -> str:
    """What a command prints on a pty ``columns`` wide (ANSI styles taken out)."""
    import os
    import pty
    import re

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *args], cwd=cwd, stdout=slave, stderr=slave,
                            env=hpctrain_env({"COLUMNS": str(columns), "TERM": "xterm"}))
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=60)
    os.close(master)
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.decode()).replace("\r", "")


def test_status_fits_an_80_column_terminal(sweep):
    out = _on_a_terminal(["status", str(sweep)], sweep.parent, 80)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#"))
    table = lines[start:start + 2 + 3]  # header, rule, three runs
    assert all(len(line) <= 80 for line in table), "\n".join(f"{len(line)}: {line}" for line in table)
    assert table[0].split()[:4] == ["#", "x", "state", "progress"] and "val/loss (min)" in table[0], out
    assert [line.split()[:3] for line in table[2:]] == [["0", "x=0", "completed"], ["1", "x=1", "completed"],
                                                        ["2", "x=3", "completed"]], out
    assert "Traceback" not in out


def test_status_piped_fits_the_width_columns_names_and_is_whole_without_it(sweep):
    def table(env) -> list:
        lines = review(["status", str(sweep)], sweep.parent, env).stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("#"))
        return lines[start:start + 2 + 3]  # header, rule, three runs

    narrow = table({"COLUMNS": "80"})
    assert all(len(line) <= 80 for line in narrow), "\n".join(f"{len(line)}: {line}" for line in narrow)
    assert [line.split()[:3] for line in narrow[2:]][0] == ["0", "x=0", "completed"], narrow
    env = hpctrain_env()
    env.pop("COLUMNS", None)
    whole = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep)], cwd=sweep.parent, env=env,
                           capture_output=True, text=True, timeout=120).stdout
    assert "log" in whole.splitlines()[1] and ".submitit" in whole, whole  # piped: every column, one line a run


def test_report_prints_csv_markdown_or_json_on_stdout(sweep):
    import csv
    import io

    done = review(["report", str(sweep), "--format", "csv"], sweep.parent)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [r["idx"] for r in rows] == ["1", "0", "2"] and rows[0]["val/loss"] == "0.0"
    assert done.stdout == (sweep / "results.csv").read_text()
    md = review(["report", str(sweep), "--format", "md"], sweep.parent).stdout
    assert md.startswith("# Sweep report") and "| rank |" in md
    shown = json.loads(review(["report", str(sweep), "--format", "json"], sweep.parent).stdout)
    assert shown["metric"] == "val/loss" and shown["best"]["idx"] == 1
