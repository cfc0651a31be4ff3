"""Finished runs' rows kept per sweep (hpctrain.review.row_cache, issue 31: status and ``hpctrain.load`` on
10,000 runs): a warm read opens no finished run's files, gives the same rows as a fresh read, and never
trusts a kept row whose files changed, a run still active, or a file another user could have planted."""

import json
import os
import time
from pathlib import Path

import pytest

from call_count import calls
from hpctrain.core import events
from hpctrain.core.state import State
from hpctrain.review import row_cache, runs
from hpctrain.review.runs import collect
from hpctrain.review.sweep import load_sweep

pytestmark = pytest.mark.login

TIME_LIMIT = "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n"


@pytest.fixture
def queue(tmp_path, monkeypatch):
    """A stand-in squeue printing what ``queue["lines"]`` holds when called; sacct without accounting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = tmp_path / "queue.txt"
    lines.write_text("")
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat {lines}\n")
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2; exit 1\n")
    for tool in ("squeue", "sacct"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(row_cache, "SETTLE_S", 0.2)  # the tests' files are new: settled after 0.2 s
    return lines


def make_sweep(root: Path, n: int = 12) -> Path:
    """``n`` runs: every third failed (its error in the record), every fourth still running, the rest done."""
    folder = root / ".submitit"
    folder.mkdir(parents=True)
    manifest = {"launcher": "slurm", "submitit_folder": str(folder), "submissions": [], "runs": {}}
    for i in range(n):
        name, job = f"{i}_lr={i}", f"100_{i}"
        manifest["runs"][str(i)] = {"name": name, "run_dir": name, "overrides": [f"lr={i}"], "job_id": job,
                                    "max_steps": 10}
        run = root / name
        events.submitted(run)
        events.started(run, job_id=job)
        if i % 4 == 3:
            summary = {"step": 4, "max_steps": 10, "started": time.time() - 30, "metrics": {"train/loss": 1.5}}
        elif i % 3 == 2:
            events.failed(run, "Traceback\nValueError: bad", rank=0)
            summary = {"step": 5, "max_steps": 10, "metrics": {"train/loss": 2.5}}
        else:
            events.completed(run)
            summary = {"step": 10, "max_steps": 10, "elapsed_s": 12.0, "metrics": {"train/loss": 0.1 * i, "val/loss": i}}
        (run / "metrics.json").write_text(json.dumps(summary))
        (folder / f"{job}_0_log.err").write_text("")
        (folder / f"{job}_0_log.out").write_text("submitit INFO - Starting\n")
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def settled_sweep(tmp_path: Path, n: int = 12) -> Path:
    sweep = make_sweep(tmp_path / "s", n)
    time.sleep(0.3)  # past SETTLE_S
    return sweep


def read(sweep: Path) -> dict:
    return {r.idx: r for r in collect(load_sweep(sweep)).runs}


def final(rows: dict) -> dict:
    return {i: r for i, r in rows.items() if r.state not in (State.RUNNING, State.QUEUED)}


def test_a_warm_read_opens_no_finished_runs_files_and_gives_the_same_rows(tmp_path, queue, monkeypatch):
    sweep = settled_sweep(tmp_path, 40)
    queue.write_text("".join(f"100_{i}|RUNNING|None\n" for i in range(3, 40, 4)))
    cold = read(sweep)
    assert (sweep / ".hpctrain" / f"rows-{os.geteuid()}.json").is_file()
    opened = []
    real = runs.events.read
    monkeypatch.setattr(runs.events, "read", lambda d: opened.append(d) or real(d))
    warm = read(sweep)
    assert sorted(Path(d).name.split("_")[0] for d in opened) == sorted(str(i) for i in range(3, 40, 4))  # the running
    assert final(warm) == final(cold) and len(final(cold)) == 30
    assert {r.state for r in warm.values()} == {State.COMPLETED, State.FAILED, State.RUNNING}
    os.unlink(row_cache.file_for(sweep))
    assert final(read(sweep)) == final(warm)  # as a read without the kept rows


def test_a_warm_read_costs_few_calls_per_finished_run(tmp_path, queue):
    """Calls a run, averaged over a sweep where a quarter of the runs still run: before the kept rows every
    read was a cold one."""
    small, large = settled_sweep(tmp_path / "a", 10), settled_sweep(tmp_path / "b", 110)
    for sweep in (small, large):
        read(sweep)

    def per_run(mode: str) -> float:
        if mode == "cold":
            for sweep in (small, large):
                os.unlink(row_cache.file_for(sweep))
        total = {s: calls(lambda s=s: read(s)) for s in (small, large)}
        return (total[large] - total[small]) / 100

    warm = per_run("warm")
    cold = per_run("cold")
    assert warm <= 290, warm  # measured: 264 (a quarter of the runs still running, read afresh), cold 427
    assert cold >= 1.5 * warm, (cold, warm)


def test_a_change_to_a_finished_runs_files_is_read_afresh(tmp_path, queue):
    sweep = settled_sweep(tmp_path)
    assert read(sweep)[0].state is State.COMPLETED and read(sweep)[1].step == 10  # kept now
    events.submitted(sweep / "0_lr=0")  # a rerun: queued again
    summary = json.loads((sweep / "1_lr=1" / "metrics.json").read_text())
    (sweep / "1_lr=1" / "metrics.json").write_text(json.dumps({**summary, "step": 9}))  # a rewritten summary
    with open(sweep / ".submitit" / "100_2_0_log.err", "a") as f:  # a failure's log that grew
        f.write(TIME_LIMIT)
    rows = read(sweep)
    assert rows[0].state is State.CANCELLED  # queued again, and not in the (stand-in) queue: left it
    assert rows[1].step == 9
    assert rows[2].state is State.TIMEOUT and rows[2].note == "hit its time limit"


def test_a_run_still_active_is_never_kept(tmp_path, queue):
    sweep = settled_sweep(tmp_path)
    queue.write_text("100_3|RUNNING|None\n")
    assert read(sweep)[3].state is State.RUNNING
    queue.write_text("")  # its job left the queue without a word from the run
    assert read(sweep)[3].state is State.FAILED and "ended without a result" in read(sweep)[3].note


def test_files_that_changed_just_before_the_read_are_not_kept(tmp_path, queue, monkeypatch):
    sweep = make_sweep(tmp_path / "s")
    monkeypatch.setattr(row_cache, "SETTLE_S", 3600.0)
    read(sweep)
    assert not os.path.exists(row_cache.file_for(sweep))


def _planted(sweep: Path, how: str) -> None:
    """A rows file saying run 0 completed at step 999 (its files say step 10), as another user could leave it."""
    path = row_cache.file_for(sweep)
    data = json.loads(Path(path).read_text())
    data["rows"][str(sweep / "0_lr=0")][1][row_cache.FIELDS.index("step")] = 999
    fake = json.dumps(data)
    os.unlink(path)
    if how == "other user":
        Path(path).write_text(fake)
        os.chmod(path, 0o600)
        os.chown(path, 54321, 54321)  # a uid that is not ours
    elif how == "group-writable":
        Path(path).write_text(fake)
        os.chmod(path, 0o660)
    elif how == "link":
        target = sweep.parent / "elsewhere.json"
        target.write_text(fake)
        target.chmod(0o600)
        os.symlink(target, path)


@pytest.mark.parametrize("how", ["other user", "group-writable", "link"])
def test_a_rows_file_someone_else_could_have_written_is_ignored(tmp_path, queue, how):
    sweep = settled_sweep(tmp_path)
    read(sweep)
    _planted(sweep, how)
    assert read(sweep)[0].step == 10
    st = os.lstat(row_cache.file_for(sweep))  # replaced by the reader's own
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o600 and not os.path.islink(row_cache.file_for(sweep))
    assert read(sweep)[0].step == 10


def test_another_users_sweep_gets_no_rows_file(tmp_path, queue):
    sweep = settled_sweep(tmp_path)
    (sweep / ".hpctrain").mkdir()
    os.chown(sweep / ".hpctrain", 54321, 54321)
    assert read(sweep)[0].state is State.COMPLETED
    assert os.listdir(sweep / ".hpctrain") == []
