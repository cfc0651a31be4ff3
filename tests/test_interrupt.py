"""Interrupting a sweep is safe and quiet (issue 29 item 1).

Local launcher: Ctrl-C typed on a real terminal (a pty; the kernel sends SIGINT to the whole foreground
process group, the runs' processes included) or SIGTERM to the launcher cancels its runs as ``cancel`` does:
the running ones checkpointed, every one ``cancelled`` (``status --json``), no process left, one line, no
traceback, exit 130 / 143; the same command again resumes them from those checkpoints and completes them.
Slurm: Ctrl-C during ``wait=true`` ends the wait only (one line saying how to cancel, exit 130); the jobs go on.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import hpctrain_env, run_hpctrain
from pty_helpers import PtyProcess, screen_lines

# ~50 steps/s at most: a run is still going when the test interrupts it; ckpt_every=0: the only checkpoint
# before the end is the one the interrupt asks for
SLOW = ["max_steps=600", "log_every=10", "eval_every=0", "ckpt_every=0", "model._target_=user_models.SlowDropout",
        "+model.delay_s=0.02"]


def sweep_args(sweep_dir: Path) -> list:
    return ["-m", "lr=0.01,0.001,0.0001", *SLOW, "hydra/launcher=local", "hydra.launcher.max_parallel=2",
            f"hydra.sweep.dir={sweep_dir}"]


def status(sweep_dir: Path) -> list:
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep_dir), "--json"], cwd=sweep_dir.parent,
                          env=hpctrain_env(), capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)["runs"] if proc.stdout.strip().startswith("{") else []


def steps(sweep_dir: Path) -> dict:
    """Each run's step as its metrics.json says (cheap enough to ask every second)."""
    out = {}
    for metrics in sweep_dir.glob("*/metrics.json"):
        try:
            out[metrics.parent.name] = json.loads(metrics.read_text()).get("step") or 0
        except (OSError, ValueError):
            pass
    return out


def wait_two_running(sweep_dir: Path, alive, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert alive(), "the launcher ended before the test interrupted it"
        done = steps(sweep_dir)
        if len([s for s in done.values() if s >= 20]) >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"two runs did not reach step 20 in {timeout_s} s: {steps(sweep_dir)}")


def processes_mentioning(text: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if text in cmd and state != "Z":
                found.append((int(entry.name), cmd))
    return found


def checkpoint_step(run_dir: Path) -> int:
    import torch

    return int(torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"])


def kill_left(sweep_dir: Path) -> None:
    for pid, _ in processes_mentioning(str(sweep_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def ctrl_c_line(args: list, sweep_dir: Path, cwd: Path, wait_running) -> str:
    """The one line a Ctrl-C on the terminal prints, once ``wait_running`` saw work under way; exit 130, no
    traceback, no process of the sweep left."""
    term = PtyProcess([sys.executable, "-m", "hpctrain", *args], cwd, hpctrain_env())
    try:
        wait_running(sweep_dir, lambda: term.poll() is None)
        mark = term.send(b"\x03")
        code = term.wait(120)
        after = term.text(mark)
        assert code == 130, (code, term.text())
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after
        lines = screen_lines(after)
        assert len(lines) == 1, after
        assert not processes_mentioning(str(sweep_dir)), "a process of the interrupted sweep is still running"
        return lines[0]
    finally:
        term.kill()
        kill_left(sweep_dir)


def assert_resumed_where_stopped(at: dict) -> None:
    for run_dir, step in at.items():
        log = (run_dir / "hpctrain.log").read_text()
        assert f"at step {step}" in log and "resumed from" in log, log[-2000:]


def test_ctrl_c_on_a_terminal_cancels_the_local_sweep_in_one_line_and_the_same_command_resumes_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    line = ctrl_c_line(sweep_args(sweep_dir), sweep_dir, tmp_path, wait_two_running)
    assert "cancelling 3 run(s)" in line and "resumes them" in line, line
    runs = status(sweep_dir)
    assert [r["state"] for r in runs] == ["cancelled"] * 3, runs
    started = [sweep_dir / Path(r["run_dir"]).name for r in runs if (r["step"] or 0) > 0]
    assert len(started) >= 2, runs
    at = {d: checkpoint_step(d) for d in started}  # checkpointed where it stopped, not only at step 0
    assert all(0 < s < 600 for s in at.values()), at

    again = run_hpctrain(sweep_args(sweep_dir), cwd=tmp_path)  # the same command
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["state"] for r in status(sweep_dir)] == ["completed"] * 3
    assert_resumed_where_stopped(at)


def test_sigterm_to_the_local_launcher_cancels_its_runs_and_exits_143(tmp_path):
    sweep_dir = tmp_path / "sweep"
    launcher = subprocess.Popen([sys.executable, "-m", "hpctrain", *sweep_args(sweep_dir)], cwd=tmp_path,
                                env=hpctrain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        wait_two_running(sweep_dir, lambda: launcher.poll() is None)
        os.kill(launcher.pid, signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 143, (launcher.returncode, out, err)
        assert "Traceback" not in out + err, out + err
        said = [line for line in err.splitlines() if line.startswith("hpctrain: SIGTERM")]
        assert len(said) == 1 and "cancelling 3 run(s)" in said[0], err
        assert not processes_mentioning(str(sweep_dir)), "a run of the stopped launcher is still running (an orphan)"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        kill_left(sweep_dir)
    runs = status(sweep_dir)
    assert [r["state"] for r in runs] == ["cancelled"] * 3, runs
    assert sum(1 for r in runs if (r["run_dir"] and (sweep_dir / Path(r["run_dir"]).name / "checkpoints" /
                                                    "last.pt").exists())) >= 2, runs


@pytest.mark.slurm
def test_ctrl_c_during_slurm_wait_stops_waiting_and_the_jobs_go_on(tmp_path, slurm_cluster):
    from slurm_helpers import job_id, queued, wait_for

    sweep_dir = tmp_path / "sweep"
    term = PtyProcess([sys.executable, "-m", "hpctrain", "-m", "lr=0.01,0.001", "max_steps=100000", "log_every=10",
                       "eval_every=0", "hydra/launcher=slurm", "hydra.launcher.wait=true",
                       f"hydra.sweep.dir={sweep_dir}"], tmp_path, hpctrain_env())
    job = None
    try:
        wait_for(lambda: (sweep_dir / "sweep.json").exists() and bool(json.loads(
            (sweep_dir / "sweep.json").read_text())["submissions"][-1].get("job_ids")), 180, "the sweep's job id")
        job = job_id(sweep_dir)
        wait_for(lambda: "submitted 2 run(s)" in term.text() and " done, " in term.text(), 120,
                 "the wait to show its progress")
        assert term.poll() is None, term.text()
        mark = term.send(b"\x03")
        code = term.wait(60)
        after = term.text(mark)
        assert code == 130, (code, term.text())
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after
        lines = screen_lines(after)
        assert len(lines) == 1, after
        assert "stopped waiting" in lines[0] and f"{job.split('_')[0]} go on" in lines[0], lines
        assert f"python -m hpctrain cancel {sweep_dir}" in lines[0], lines
        assert queued(job), "the jobs were cancelled with the wait; they must go on"
        time.sleep(3)
        assert queued(job), "the jobs left the queue after the wait ended"
    finally:
        term.kill()
        if job is not None:
            subprocess.run([sys.executable, "-m", "hpctrain", "cancel", str(sweep_dir)], cwd=tmp_path,
                           env=hpctrain_env(), capture_output=True, timeout=120)
            subprocess.run(["scancel", job.split("_")[0]], capture_output=True)


# ---------------------------------------------------------------- a local search (hydra/sweeper=search)
def search_args(sweep_dir: Path) -> list:
    return ["-m", "hydra/sweeper=search", "lr=tag(log,interval(1e-4,1e-2))", "hydra.sweeper.n_trials=3",
            "hydra.sweeper.n_workers=2", "hydra.sweeper.pruner=none", "hydra.sweeper.seed=0", *SLOW,
            "hydra/launcher=local", "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={sweep_dir}"]


def study_trials(sweep_dir: Path) -> list:
    import optuna

    return optuna.load_study(study_name="search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(sweep_dir / ".hpctrain" / "study.journal")))).get_trials()


def trial_steps(sweep_dir: Path) -> dict:
    return {name: step for name, step in steps(sweep_dir).items() if name.startswith("trial-")}


def wait_two_trials_running(sweep_dir: Path, alive, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert alive(), "the launcher ended before the test interrupted it"
        if len([s for s in trial_steps(sweep_dir).values() if s >= 20]) >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"two trials did not reach step 20 in {timeout_s} s: {trial_steps(sweep_dir)}")


def assert_interrupted_search_left_resumable(sweep_dir: Path) -> dict:
    """No trial failed by the interrupt: the running ones cancelled, checkpointed where they stopped; none FAIL
    in the study; the trial checkpoint steps by run dir."""
    runs = status(sweep_dir)
    assert runs and not [r for r in runs if r["state"] == "failed"], runs
    cancelled = [sweep_dir / Path(r["run_dir"]).name for r in runs if r["state"] == "cancelled"]
    assert len(cancelled) >= 2, runs
    at = {d: checkpoint_step(d) for d in cancelled}
    assert all(0 < s < 600 for s in at.values()), at
    assert not [t for t in study_trials(sweep_dir) if t.state.name == "FAIL"], study_trials(sweep_dir)
    return at


def test_ctrl_c_on_a_local_search_cancels_its_trials_in_one_line_and_the_same_command_finishes_the_study(tmp_path):
    sweep_dir = tmp_path / "sweep"
    line = ctrl_c_line(search_args(sweep_dir), sweep_dir, tmp_path, wait_two_trials_running)
    assert "Ctrl-C" in line and "resumes" in line, line
    at = assert_interrupted_search_left_resumable(sweep_dir)

    again = run_hpctrain(search_args(sweep_dir), cwd=tmp_path, timeout=600)  # the same command
    assert again.returncode == 0, again.stdout + again.stderr
    for run_dir in at:  # waiting for a worker again (queued, not counted done), then taken up
        number = int(run_dir.name.split("_")[0].split("-")[1])
        assert re.search(rf"^  started +#{number} .*\[0/3 done", again.stdout, re.M), again.stdout
    found = study_trials(sweep_dir)
    assert sorted(t.number for t in found) == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in found), found
    assert sorted(r["state"] for r in status(sweep_dir)) == ["completed"] * 3
    assert_resumed_where_stopped(at)


def test_sigterm_to_a_local_search_cancels_its_trials_and_exits_143(tmp_path):
    sweep_dir = tmp_path / "sweep"
    launcher = subprocess.Popen([sys.executable, "-m", "hpctrain", *search_args(sweep_dir)], cwd=tmp_path,
                                env=hpctrain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        wait_two_trials_running(sweep_dir, lambda: launcher.poll() is None)
        os.kill(launcher.pid, signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 143, (launcher.returncode, out, err)
        assert "Traceback" not in out + err, out + err
        said = [line for line in err.splitlines() if line.startswith("hpctrain: SIGTERM")]
        assert len(said) == 1, err
        assert not processes_mentioning(str(sweep_dir)), "a worker of the stopped search is still running (an orphan)"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        kill_left(sweep_dir)
    assert_interrupted_search_left_resumable(sweep_dir)
