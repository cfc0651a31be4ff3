"""A PBT trial's reproduce line is its schedule replayed as one run, with the snapshot's environment
(PYTHONPATH to the submission's code), not its start values (issue 29 item 6)."""

import json

from cli_helpers import run_hpctrain


def test_the_reproduce_line_of_a_pbt_trial_is_its_replay_with_the_snapshots_pythonpath(tmp_path):
    sweep = tmp_path / "s"
    run_hpctrain(["-m", "hydra/sweeper=search", "hydra.sweeper.scheduler=pbt", "lr=tag(log,interval(1e-4,1e-1))",
                  "hydra.sweeper.population=2", "hydra.sweeper.interval=5", "hydra.sweeper.seed=0", "max_steps=10",
                  "eval_every=5", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300)
    # the search's ETA counts PBT's units by this (hpctrain.search.eta)
    assert json.loads((sweep / "sweep.json").read_text())["search"]["interval"] == 5
    found = {}
    for run_dir in (p for p in sweep.iterdir() if (p / "metrics.json").is_file()):
        record = json.loads((run_dir / "metrics.json").read_text())
        found[run_dir] = record
    exploiter = next(r for r in found.values() if any(e.get("parent") is not None for e in r.get("lineage", [])))
    other = next(r for r in found.values() if r is not exploiter)
    # rank so that the trial that exploited is the best: its schedule has two stretches
    mode = "min" if exploiter["metrics"]["val/loss"] < other["metrics"]["val/loss"] else "max"
    out = run_hpctrain(["report", str(sweep), "--metric", "val/loss", "--mode", mode], cwd=tmp_path).stdout
    (reproduce,) = [line[len("reproduce: "):] for line in out.splitlines() if line.startswith("reproduce: ")]
    (replay,) = [line[len("replay as one run: "):] for line in out.splitlines() if line.startswith("replay as one run: ")]
    assert "schedule=" in replay, out
    assert reproduce.startswith("PYTHONPATH=") and ".hpctrain/submission-0/code" in reproduce, reproduce
    assert reproduce.endswith(replay.split(" ", 1)[1]), (reproduce, replay)  # the replay's `-m hpctrain ...`
    assert "Traceback" not in out


def test_the_launch_summary_and_report_name_the_same_params_of_the_best_pbt_trial_and_say_which(tmp_path):
    sweep = tmp_path / "s"
    launched = run_hpctrain(["-m", "hydra/sweeper=search", "hydra.sweeper.scheduler=pbt",
                             "lr=tag(log,interval(1e-4,1e-1))", "hydra.sweeper.population=2", "hydra.sweeper.interval=5",
                             "hydra.sweeper.seed=0", "max_steps=15", "eval_every=5", "hydra/launcher=local",
                             f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300).stdout
    (best,) = [line.strip() for line in launched.splitlines() if line.strip().startswith("best: trial ")]
    number = best.split()[2]
    assert " final params lr=" in best, launched  # says which: the final ones, not the start values
    said = best[best.index("final params "):]
    out = run_hpctrain(["report", str(sweep)], cwd=tmp_path).stdout
    (report_best,) = [line for line in out.splitlines() if line.startswith("best: #")]
    assert report_best.startswith(f"best: #{number} "), (report_best, best)
    assert f"  PBT: {said}" in out.splitlines(), (said, out)
    import hpctrain

    (run,) = [r for r in hpctrain.load(sweep).runs if r.idx == int(number)]
    lineage = json.loads((run.run_dir / "metrics.json").read_text())["lineage"]
    assert f"lr={lineage[-1]['params']['lr']:.4g}" in said  # the params it trained with last
