"""A blocking sweep's progress display: redrawn in place on a terminal (a real pseudo-terminal), one line
per event when piped, and the closing summary of one short line per run."""

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from cli_helpers import hpctrain_env, run_hpctrain

from hpctrain.core import events, summary
from hpctrain.core.run import RunSpec
from hpctrain.submit.progress import Progress

REDRAW = re.compile(r"\x1b\[(\d+)F\x1b\[J")
# long enough that a run trains across several of the display's reads (1 s) on a loaded machine too: a
# 200-step run trained between two reads there, and the display only ever saw it starting
STEPS = 2000
SWEEP = ["-m", "lr=1e-3,1e-2", f"max_steps={STEPS}", "seed=3", "hydra/launcher=local"]


def screen(raw: str) -> list:
    """The lines a terminal shows at the end: each redraw moves up over the block it clears."""
    lines: list = []
    pos = 0
    for m in REDRAW.finditer(raw):
        lines += raw[pos:m.start()].split("\n")[:-1]
        del lines[len(lines) - int(m.group(1)):]
        pos = m.end()
    return lines + raw[pos:].split("\n")


def test_a_local_sweep_on_a_terminal_redraws_its_progress_in_place(tmp_path):
    sweep = tmp_path / "sweep"
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *SWEEP, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                            env=hpctrain_env({"COLUMNS": "200"}), stdout=slave, stderr=subprocess.PIPE, stdin=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    raw = b"".join(chunks).decode().replace("\r\n", "\n")
    redraws = REDRAW.findall(raw)
    assert len(redraws) >= 3, raw  # the block was drawn, then redrawn in place more than once
    # while a run trained, the block showed the counts and its step out of its budget
    assert re.search(r"hpctrain: 0/2 done, 1 running, 0 failed", raw), raw
    steps = [int(s) for s in re.findall(rf"  #\d lr=0\.0\d+  step (\d+)/{STEPS} ", raw)]
    assert steps and all(0 <= s <= STEPS for s in steps), raw
    assert re.search(r"hpctrain: 1/2 done, 1 running, 0 failed, ETA \d[\dmhs]*", raw), raw
    shown = [line for line in screen(raw) if line.strip()]
    # at the end the block is gone: ended runs stay as one line each, then the closing summary
    assert not any(line.startswith("hpctrain: 0/2") or " step " in line for line in shown), shown
    ended = [line for line in shown if line.lstrip().startswith("completed #")]
    assert [line.split()[1] for line in ended] == ["#0", "#1"], shown
    assert not any(line.lstrip().startswith("started ") for line in shown), shown  # starts live in the block


def test_a_piped_local_sweep_prints_one_line_per_event_and_a_short_summary(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain([*SWEEP, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    out = proc.stdout
    assert "\x1b[" not in out and "\r" not in out
    events_ = [line.split()[:2] for line in out.splitlines()
               if re.match(r"  (started|completed|failed|retrying) +#", line)]
    assert sorted(events_, key=lambda e: e[1]) == [["started", "#0"], ["completed", "#0"],
                                                   ["started", "#1"], ["completed", "#1"]]
    assert events_.index(["completed", "#0"]) > events_.index(["started", "#0"])
    last = [line for line in out.splitlines() if line.lstrip().startswith("completed #1")]
    assert len(last) == 1 and last[0].endswith("[2/2 done, 0 running, 0 failed]"), out
    # the summary: the swept value, the state, the objective; the constant overrides are not repeated
    run_dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    rows = [line for line in out.splitlines() if re.match(r"  #\d ", line)]
    assert len(rows) == 2, out
    for idx, (row, run_dir) in enumerate(zip(rows, run_dirs)):
        found = json.loads((run_dir / "metrics.json").read_text())
        value = found["metrics"][found["objective"]["metric"]]
        lr = ["0.001", "0.01"][idx]
        assert row.split() == [f"#{idx}", f"lr={lr}", "completed", f"val/loss={value:.4g}"], row
        assert "max_steps" not in row and "seed" not in row and len(row) < 60


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _specs(tmp_path: Path, n: int):
    out = []
    for i in range(n):
        run_dir = tmp_path / f"{i}_lr={i}"
        run_dir.mkdir()
        events.submitted(run_dir)
        out.append(RunSpec(i, (f"lr={i}", "max_steps=100"), run_dir, 100))
    return out


def test_a_failure_shows_once_its_job_has_ended_with_its_error(tmp_path):
    """A failure recorded while the job is still alive may yet be retried: it shows running until then."""
    specs = _specs(tmp_path, 2)
    alive = {0: True, 1: True}
    stream = io.StringIO()
    clock = [0.0]
    progress = Progress(specs, stream=stream, alive=lambda i: alive[i], clock=lambda: clock[0])
    events.started(specs[0].run_dir, job_id="111")
    summary.write(specs[0].run_dir, step=40, max_steps=100)
    clock[0] = 10.0
    progress.update()
    assert stream.getvalue().splitlines() == ["  started   #0 lr=0 (job 111)   [0/2 done, 1 running, 0 failed, ETA 40s]"]
    events.failed(specs[0].run_dir, "Traceback ...\nValueError: a bad shape")
    clock[0] = 20.0
    progress.update()
    assert len(stream.getvalue().splitlines()) == 1  # not yet: its job has not ended
    alive[0] = False
    progress.update(force=True)
    assert stream.getvalue().splitlines()[-1] == "  failed    #0 lr=0: ValueError: a bad shape   [1/2 done, 0 running, 1 failed, ETA 20s]"


def test_the_terminal_block_lists_running_runs_with_their_steps(tmp_path):
    specs = _specs(tmp_path, 3)
    stream = _Terminal()
    progress = Progress(specs, stream=stream, clock=lambda: 5.0)
    for spec, step in zip(specs[:2], (10, 50)):
        events.started(spec.run_dir)
        summary.write(spec.run_dir, step=step, max_steps=100)
    progress.update()
    assert stream.getvalue().splitlines() == ["hpctrain: 0/3 done, 2 running, 0 failed",
                                              "  #0 lr=0  step 10/100  10%", "  #1 lr=1  step 50/100  50%"]
    events.completed(specs[0].run_dir)
    progress.update(force=True)
    tail = stream.getvalue().split("\x1b[3F\x1b[J")[-1].splitlines()
    assert tail == ["  completed #0 lr=0   [1/3 done, 1 running, 0 failed]",
                    "hpctrain: 1/3 done, 1 running, 0 failed", "  #1 lr=1  step 50/100  50%"]
    progress.close()
    assert stream.getvalue().endswith("\x1b[2F\x1b[J")  # the block taken away; the closing summary follows


def test_a_retry_shows_retrying_then_the_new_attempts_job(tmp_path):
    (spec,) = _specs(tmp_path, 1)
    stream = io.StringIO()
    progress = Progress([spec], stream=stream, clock=lambda: 0.0)
    events.started(spec.run_dir, job_id="111")
    progress.update()
    events.failed(spec.run_dir, "OSError: a node went away")
    events.retrying(spec.run_dir, 1, 1)
    progress.update(force=True)
    events.started(spec.run_dir, job_id="222")
    progress.update(force=True)
    assert [line.split("   [")[0] for line in stream.getvalue().splitlines()] == [
        "  started   #0 lr=0 max_steps=100 (job 111)", "  retrying  #0 lr=0 max_steps=100",
        "  started   #0 lr=0 max_steps=100 (job 222)"]
