"""The read side's bugs found by fault injection (issue 26): a search whose workers all died, a trial waiting
to be adopted, and local sweeps with odd clocks and dead attempts. Sweep dirs written by hand, a stand-in
``squeue``/``sacct`` on PATH where the queue matters (as in test_review_units); no Slurm needed."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import hpctrain_env
from hpctrain.core import events
from hpctrain.review.runs import collect
from hpctrain.review.sweep import find_sweep_dir, load_sweep
from hpctrain.slurm.parse import array_ids
from test_review_units import RUNNING, SUBMITTED, make_sweep, started
from test_review_units import fake_squeue  # noqa: F401 - a fixture

DEAD_PID = "4194303"  # above the default pid_max: never a live process
CRASH = "omegaconf.errors.ConfigAttributeError: Key 'max_steps' is not in struct"


def _search(sweep: Path, workers: list, launcher: str) -> None:
    """Make ``sweep`` a search sweep whose submission started ``workers``."""
    data = json.loads((sweep / "sweep.json").read_text()) if (sweep / "sweep.json").exists() else {
        "launcher": launcher, "submitit_folder": str(sweep / ".submitit"), "runs": {}}
    data["search"] = {"metric": "val/loss", "direction": "minimize", "n_trials": 8, "n_workers": len(workers)}
    data["submissions"] = [{"time": time.time(), "job_ids": [], "runs": [],
                            "workers": len(workers), "worker_job_ids": workers}]
    (sweep / "sweep.json").write_text(json.dumps(data))


def _status(sweep: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep), *args], env=hpctrain_env(
        {"PATH": os.environ["PATH"]}), capture_output=True, text=True, timeout=120)


def test_a_search_whose_workers_all_died_says_so_with_their_error(tmp_path):
    """Every worker crashed at start: no trial, no run dir. status names the dead workers and their error
    (from each worker's record in .hpctrain/workers) and exits non-zero, instead of "0 runs"."""
    sweep = tmp_path / "s"
    (sweep / ".submitit").mkdir(parents=True)
    _search(sweep, [DEAD_PID, str(int(DEAD_PID) - 1)], "local")
    (sweep / "multirun.yaml").write_text("hydra:\n  sweeper:\n    _target_: hydra_plugins.hpctrain.Search\n"
                                         "  launcher:\n    _target_: hydra_plugins.hpctrain.LocalLauncher\n")
    for i in range(2):
        placeholder = sweep / ".hpctrain" / "workers" / f"worker-{i}"
        placeholder.mkdir(parents=True)
        events.submitted(placeholder)
        events.started(placeholder, job_id=DEAD_PID)
        events.failed(placeholder, error=f"Traceback (most recent call last):\n  ...\n{CRASH}")
    proc = _status(sweep)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no manifest yet" not in proc.stdout
    assert "2 workers died" in proc.stdout and proc.stdout.count(CRASH) == 2, proc.stdout
    assert json.loads(_status(sweep, "--json").stdout)["dead_workers"] == [
        f"worker {j} died: {CRASH}" for j in sorted([DEAD_PID, str(int(DEAD_PID) - 1)], key=int)]


def test_a_trial_waiting_to_be_adopted_is_not_final(tmp_path, fake_squeue):  # noqa: F811 - the fixture
    """Its worker's job ended (cancelled, says the job's log; FAILED, says sacct) while another worker of the
    search still runs: the study hands the trial to it, so status must not call it cancelled or failed."""
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("200_0")], "job_id": "200_0",
            "err": "slurmstepd: error: *** JOB 200 ON n1 CANCELLED AT 2026-12-01T09:15:00 ***\n"},
        1: {"metrics": RUNNING, "record": [SUBMITTED, started("200_2")], "job_id": "200_2"},
    })
    _search(sweep, ["200_0", "200_1", "200_2"], "slurm")
    fake_squeue(["200_1|RUNNING|None"], acct=["200_0|CANCELLED", "200_2|FAILED"])
    runs = collect(load_sweep(sweep)).runs
    assert [r.state for r in runs] == ["queued", "queued"], [(r.state, r.note) for r in runs]
    assert all("adopt" in r.note for r in runs)
    fake_squeue([], acct=["200_0|CANCELLED", "200_2|FAILED"])  # no worker left: nobody adopts them
    assert [r.state for r in collect(load_sweep(sweep)).runs] == ["cancelled", "failed"]


def test_a_future_mtime_does_not_bring_a_dead_local_sweep_back(tmp_path):
    """A local sweep whose launcher is gone, one run done with a metrics.json dated an hour ahead: the run
    that never started is not shown queued (a negative age is no sign of a live launcher)."""
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": {"step": 10, "max_steps": 10}, "record": [SUBMITTED, started(DEAD_PID), ("completed", {})],
            "job_id": DEAD_PID},
        1: {"record": [SUBMITTED], "job_id": None},
    }, launcher="local")
    ahead = time.time() + 3600
    os.utime(sweep / "0_lr=0" / "metrics.json", (ahead, ahead))
    states = [r.state for r in collect(load_sweep(sweep)).runs]
    assert states == ["completed", "cancelled"]


def test_a_dead_attempt_without_an_end_is_not_costed_up_to_now(tmp_path):
    """A local run whose process died without an end event: its wall time stops where its files stopped
    (metrics.json's last write), read now or later."""
    sweep = make_sweep(tmp_path / "s", {0: {"record": [SUBMITTED, started(DEAD_PID)], "job_id": DEAD_PID}},
                       launcher="local")
    run_dir = sweep / "0_lr=0"
    begun = events.read(run_dir).started_at
    (run_dir / "metrics.json").write_text(json.dumps({"step": 4, "max_steps": 10, "updated": begun + 0.5}))
    time.sleep(0.8)  # the process died at begun + 0.5 s
    (first,) = collect(load_sweep(sweep)).runs
    time.sleep(1.2)
    (later,) = collect(load_sweep(sweep)).runs
    assert first.state == "failed"
    assert first.wall_s == later.wall_s and abs(first.wall_s - 0.5) < 0.1, (first.wall_s, later.wall_s)
    assert first.cost.wall_s == later.cost.wall_s


def test_job_ids_in_number_order():
    assert array_ids(["101_0", "99_3", "99_1", "7"]) == ["7", "99", "101"]


def test_status_without_a_dir_is_not_misled_by_a_future_mtime(tmp_path, monkeypatch):
    """An older sweep whose sweep.json is dated in the future does not hide the newer ones."""
    old = make_sweep(tmp_path / "multirun" / "2026-12-01" / "10-00-00", {0: {}})
    new = make_sweep(tmp_path / "multirun" / "2026-12-02" / "09-00-00", {0: {}})
    ahead = time.time() + 86400
    os.utime(old / "sweep.json", (ahead, ahead))
    monkeypatch.chdir(tmp_path)
    assert find_sweep_dir(None) == new.absolute()


def test_status_shows_slurms_pending_reason(tmp_path, fake_squeue):  # noqa: F811 - the fixture
    fake_squeue(["100_0|PENDING|Priority", "100_1|PENDING|QOSMaxJobsPerUserLimit", "100_2|RUNNING|None"])
    sweep = make_sweep(tmp_path / "s", {0: {}, 1: {}, 2: {"metrics": RUNNING, "record": [SUBMITTED, started("100_2")]}})
    out = _status(sweep)
    rows = [line.split() for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert [row[2:4] for row in rows[:2]] == [["queued", "(Priority)"], ["queued", "(QOSMaxJobsPerUserLimit)"]], out.stdout
    assert rows[2][2] == "running" and "Traceback" not in out.stderr


def test_the_tabs_running_row_has_its_latest_objective_step_rung_parent_and_log(tmp_path, fake_squeue):  # noqa: F811
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from hpctrain.review.tensorboard_plugin.data import TailCache, payload

    fake_squeue(["100_0|RUNNING|None"])
    declared = {**RUNNING, "objective": {"metric": "val/loss", "mode": "min"},
                "lineage": [{"step": 0, "parent": None, "params": {}}, {"step": 4, "parent": 3, "params": {}}]}
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": declared, "record": [SUBMITTED, started("100_0")],
                                            "err": "", "out": "submitit INFO - Starting\nstep 4 loss 1.5\n"}})
    run_dir = next(p for p in sweep.iterdir() if p.name.startswith("0_"))
    writer = EventFileWriter(str(run_dir / "tb"))
    for step, value in ((2, 2.5), (4, 1.25)):
        writer.add_event(Event(wall_time=time.time(), step=step,
                               summary=Summary(value=[Summary.Value(tag="val/loss", simple_value=value)])))
    writer.close()
    row = payload(sweep, TailCache())["runs"][0]
    assert row["state"] == "running" and row["objective"] == 1.25 and row["objective_step"] == 4, row
    assert row["parent"] == 3 and row["log"] and row["log"].endswith("_log.out"), row
