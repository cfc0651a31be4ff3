"""Schedulers on this machine (the local launcher): promotion ASHA of hpctrain's trainer and of a user's own
app through ``hpctrain.trial``, status and report of a paused-and-promoted study, and the bad inputs
refused on the login node (one line each, nothing submitted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain

from test_search import record_kinds, run_dir_of, search, trial_dirs, trials

TRIAL_APP = HELPERS / "trial_app.py"
FOREIGN_APP = HELPERS / "foreign_app.py"
ASHA = ["hydra.sweeper.scheduler=asha", "hydra.sweeper.eta=3", "hydra.sweeper.seed=0"]


def app(script: Path, args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=timeout)


def closed_form(lr: float, steps: int) -> float:
    x = 0.0
    for _ in range(steps):
        x -= lr * 2 * (x - 3)
    return x


def test_a_users_app_paused_and_promoted_resumes_at_its_rung_with_the_state_it_paused_with(tmp_path):
    sweep = tmp_path / "sweep"
    proc = app(TRIAL_APP, search(sweep, "lr=interval(0.001,0.05)", "hydra.sweeper.n_trials=9",
                                 "hydra.sweeper.n_workers=3", "hydra.launcher.max_parallel=3", *ASHA,
                                 launcher="local"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = trials(sweep)
    assert sorted(t.number for t in found) == list(range(9))  # n_trials, never more
    assert {t.state.name for t in found} <= {"COMPLETE", "PRUNED"} and any(t.state.name == "COMPLETE" for t in found)
    promoted = 0
    for t in found:
        d = run_dir_of(sweep, t.number)
        starts = [json.loads(line) for line in (d / "starts.jsonl").read_text().splitlines()]
        assert starts[0] == {"start_step": 0, "x": 0.0, "end": 10}
        for before, after in zip(starts, starts[1:]):  # resumed at the rung it paused at, with its state there
            assert after["start_step"] == before["end"] and after["end"] == before["end"] * 3
            assert after["x"] == closed_form(t.params["lr"], before["end"])  # bit for bit: an uninterrupted run's
        promoted += len(starts) - 1
        kinds = record_kinds(d)
        assert kinds.count("started") == len(starts) and kinds.count("paused") == len(starts) - (t.state.name == "COMPLETE")
        assert kinds[-1] == ("completed" if t.state.name == "COMPLETE" else "pruned")
        m = json.loads((d / "metrics.json").read_text())
        assert m["rung"] == len(starts) - 1 and sorted(map(int, m["values_at"])) == [s["end"] for s in starts]
        if t.state.name == "COMPLETE":
            assert starts[-1]["end"] == 90 and t.value == pytest.approx((closed_form(t.params["lr"], 90) - 3) ** 2)
    assert promoted >= 4  # 9 -> at least 3 promoted to step 30, and one of those to 90
    best = min(found, key=lambda t: (closed_form(t.params["lr"], 10) - 3) ** 2)
    assert best.state.name == "COMPLETE"  # noiseless and monotone in lr: the best at rung 0 goes all the way


def test_hpctrain_trainer_under_asha_status_shows_each_rung_and_report_the_rung_table(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(search(sweep, "lr=tag(log,interval(1e-3,1e-1))", "hydra.sweeper.n_trials=5",
                        "hydra.launcher.max_parallel=2", *ASHA, "hydra.sweeper.min_steps=5", "max_steps=45",
                        "eval_every=5", "log_every=5", "ckpt_every=0", "data.train_size=256", "data.val_size=64",
                        "model.hidden=8", launcher="local"), cwd=tmp_path, timeout=600)
    found = trials(sweep)
    assert len(found) == 5 and len(trial_dirs(sweep)) == 5
    status = json.loads(run_hpctrain(["status", str(sweep), "--json"], cwd=tmp_path).stdout)
    stages = {r["idx"]: r["stage"] for r in status["runs"]}
    restarts = {r["idx"]: r["restarts"] for r in status["runs"]}
    for t in found:
        m = json.loads((run_dir_of(sweep, t.number) / "metrics.json").read_text())
        assert stages[t.number] == f"rung {m['rung']}"
        assert m["step"] == [5, 15, 45][m["rung"]]  # paused (then ended pruned) at exactly its rung's step
    assert any(int(m) > 0 for m in (json.loads((run_dir_of(sweep, t.number) / "metrics.json").read_text())["rung"]
                                    for t in found))  # some trial was promoted
    assert set(restarts.values()) == {0}, restarts  # a promotion is a scheduled unit, not a restart
    text = run_hpctrain(["status", str(sweep)], cwd=tmp_path).stdout
    assert " unit " in text.splitlines()[1] and "rung 0" in text
    report = run_hpctrain(["report", str(sweep)], cwd=tmp_path).stdout
    reached0 = sum(1 for t in found)
    assert f"rung 0  step 5: {reached0} trial(s)" in report, report


def test_paused_state_is_what_status_shows_while_a_trial_waits(tmp_path):
    """A study stopped while trials are paused (its workers killed): status says paused, not running."""
    from hpctrain.core import events, manifest
    from hpctrain.core.run import RunSpec

    sweep = tmp_path / "sweep"
    run_dir = sweep / "trial-000_lr=0.1"
    run_dir.mkdir(parents=True)

    def add(m):
        m.launcher = "local"
        m.search = {"n_trials": 1, "metric": "value", "direction": "minimize", "scheduler": "asha"}
        m.runs[0] = manifest.RunEntry(RunSpec(0, ("lr=0.1",), run_dir, 90), "1", {"trial": 0})

    manifest.update(sweep, add)
    events.submitted(run_dir)
    events.started(run_dir, job_id=str(__import__("os").getpid()))  # a live process: would read as running
    events.paused(run_dir, step=10)
    (run_dir / "metrics.json").write_text(json.dumps({"status": "paused", "step": 10, "max_steps": 90, "rung": 0}))
    status = json.loads(run_hpctrain(["status", str(sweep), "--json"], cwd=tmp_path).stdout)
    assert [(r["state"], r["stage"]) for r in status["runs"]] == [("paused", "rung 0")]


BAD = [
    (["hydra.sweeper.eta=1"], "hydra.sweeper.eta=1: expected an integer >= 2"),
    (["hydra.sweeper.min_steps=20"], "hydra.sweeper.min_steps=20: expected fewer than max_steps=20"),
    (["hydra.sweeper.min_steps=7"], "hydra.sweeper.min_steps=7: expected a multiple of eval_every=5"),
    (["hydra.sweeper.scheduler=fifo"], "hydra.sweeper.scheduler=fifo: unknown scheduler"),
    (["hydra.sweeper.scheduler=pbt", "hydra.sweeper.population=1"], "hydra.sweeper.population=1: expected an integer >= 2"),
    (["hydra.sweeper.scheduler=pbt", "hydra.sweeper.interval=7"], "hydra.sweeper.interval=7: expected a multiple of eval_every=5"),
    (["hydra.sweeper.scheduler=pbt", "hydra.sweeper.interval=3"], "hydra.sweeper.interval=3: expected a multiple of eval_every=5"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_scheduler_settings_are_refused_on_the_login_node(tmp_path, args, message):
    sweep = tmp_path / "sweep"
    overrides = ["lr=interval(1e-4,1e-1)", "hydra.sweeper.scheduler=asha", *args, "max_steps=20", "eval_every=5"]
    proc = run_hpctrain(search(sweep, *overrides, launcher="local"), cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode != 0
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and message in problems[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (sweep / ".hpctrain" / "study.journal").exists()


def test_an_app_that_does_not_use_the_trial_api_is_refused_a_scheduler(tmp_path):
    sweep = tmp_path / "sweep"
    proc = app(FOREIGN_APP, search(sweep, "+x=interval(0,2)", "+max_steps=10", "hydra.sweeper.scheduler=asha",
                                   launcher="local"), tmp_path, timeout=120)
    assert proc.returncode != 0
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and "does not use hpctrain's trial API" in problems[0], proc.stderr
    assert not (sweep / ".hpctrain" / "study.journal").exists()
    # the same app with scheduler=none runs as before
    ok = app(FOREIGN_APP, search(sweep, "+x=interval(0,2)", "+number_only=true", "hydra.sweeper.n_trials=1",
                                 "hydra.sweeper.pruner=none", launcher="local"), tmp_path)
    assert ok.returncode == 0, ok.stderr
