"""Promotion ASHA on the real test cluster: 9 trials, 3 workers of one job array, eta 3. Trials pause at
their rungs and are promoted by whichever worker is free; a worker SIGKILLed in the middle of a unit leaves
it to another, which resumes it from its last checkpoint; the study still ends with each promotion once."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from cli_helpers import run_hpctrain
from slurm_helpers import cancel, job_id, metrics, queued, wait_for

from test_search import run_dir_of, search, trial_dirs, trials

STEPS = ["max_steps=540", "eval_every=20", "log_every=5", "ckpt_every=10", "data.train_size=512",
         "data.val_size=64", "model.hidden=32"]
ASHA = ["hydra.sweeper.scheduler=asha", "hydra.sweeper.eta=3", "hydra.sweeper.min_steps=60",
        "hydra.sweeper.n_trials=9", "hydra.sweeper.n_workers=3", "hydra.sweeper.seed=1",
        "hydra.sweeper.heartbeat_s=2", "hydra.sweeper.grace_s=20"]
RUNGS = [60, 180, 540]


def starts(run_dir: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted((run_dir / ".hpctrain" / "record").glob("*.started.*"))]


def last_unit_under_way(sweep: Path) -> "tuple[int, str, int] | None":
    """(trial, owner) of a unit to the last rung whose newest checkpoint is 10 to 150 steps into its 360 (a long
    unit: the kill lands inside it, after a checkpoint of its own). The checkpoint, not metrics.json, says
    where it is: metrics.json's step is written at most every few seconds."""
    leases = sweep / ".hpctrain" / "trials"
    for p in leases.glob("*.json") if leases.exists() else []:
        lease = json.loads(p.read_text())
        unit = lease.get("unit")
        if lease.get("paused") or lease.get("ended") or not unit or unit["end_step"] != RUNGS[-1]:
            continue
        dirs = [d for d in trial_dirs(sweep) if d.name.startswith(f"trial-{int(p.stem):03d}")]
        try:
            step = int(torch.load(dirs[0] / "checkpoints" / "last.pt", weights_only=True)["step"]) if dirs else 0
        except (OSError, RuntimeError, KeyError, EOFError):
            continue  # being replaced (rename) or not there yet
        if unit["start_step"] + 10 <= step <= unit["start_step"] + 150:
            return int(p.stem), str(lease["owner"]), int(lease["pid"])
    return None


@pytest.mark.slurm
def test_asha_pauses_and_promotes_and_a_sigkilled_worker_costs_no_promotion(tmp_path, slurm_cluster):
    sweep = tmp_path / "sweep"
    args = search(sweep, "lr=tag(log,interval(1e-3,1e-1))", *ASHA, *STEPS)
    run_hpctrain(args, cwd=tmp_path, timeout=120)
    job = job_id(sweep)
    try:
        under_way: list = []

        def look() -> bool:  # the unit seen is the one killed: a second look may find it past 150 steps, or none
            under_way[:] = [last_unit_under_way(sweep)]
            return under_way[0] is not None

        wait_for(look, 1200, "a worker under way with a unit to the last rung", every=0.1)
        killed, victim, pid = under_way[0]
        # SIGKILL to the worker's process itself (the test cluster runs on this host): no warning, no checkpoint
        # call, and at once (scancel's signal was seen to land seconds later, after a 5-s unit had ended)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not queued(job), 1500, "the workers to finish the study")
    finally:
        cancel(job)
    found = trials(sweep)
    assert sorted(t.number for t in found) == list(range(9))  # n_trials, never more
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in found), [(t.number, t.state) for t in found]
    promotions = Counter()
    for t in found:
        d = run_dir_of(sweep, t.number)
        s = starts(d)
        units = [x["unit"] for x in s]
        # each rung of a trial is run (started) by one unit claim; a retake of a dead worker's unit is "adopted"
        for x in s:
            if x["how"] == "promote":
                promotions[(t.number, x["unit"]["index"])] += 1
        assert [u["index"] for u in units] == sorted(u["index"] for u in units)  # rungs in order
        m = metrics(d)
        reached = m["rung"]
        assert m["step"] == RUNGS[reached] and sorted(map(int, m["values_at"])) == RUNGS[: reached + 1]
        assert (t.state.name == "COMPLETE") == (reached == 2)
        log = (d / "hpctrain.log").read_text()
        for rung in range(reached):  # each promotion resumed from the checkpoint of the rung it paused at
            assert f"at step {RUNGS[rung]}" in log, log[-2000:]
    assert promotions and set(promotions.values()) == {1}, promotions  # no trial promoted twice
    reached = Counter(metrics(run_dir_of(sweep, t.number))["rung"] for t in found)
    assert reached[0] + reached[1] + reached[2] == 9 and reached[1] + reached[2] >= 3 and reached[2] >= 1, reached
    assert sum(promotions.values()) == reached[1] + 2 * reached[2]  # each rung a trial reached: one promotion
    # the killed worker's unit was taken over by another worker, from its last checkpoint (not from scratch)
    d = run_dir_of(sweep, killed)
    s = starts(d)
    adopted = [x for x in s if x["how"] == "adopted"]
    assert adopted and adopted[-1]["job_id"] != victim, json.dumps(s)  # the whole list, not pytest's cut repr
    unit = [x for x in s if x["job_id"] == victim][-1]["unit"]
    assert adopted[-1]["unit"] == unit  # the same unit, resumed
    resumed_at = [int(line.rsplit("at step ", 1)[1].split()[0]) for line in
                  (d / "hpctrain.log").read_text().splitlines() if "resumed from" in line]
    assert any(unit["start_step"] < r < unit["end_step"] for r in resumed_at), resumed_at  # its last checkpoint
    # a promoted trial ends with the weights of one uninterrupted run of its config (CPU, here)
    (best,) = [t for t in found if t.state.name == "COMPLETE"][:1]
    replay = tmp_path / "replay"
    lr = best.params["lr"]
    subprocess.run([sys.executable, "-m", "hpctrain", *STEPS, f"lr={lr!r}", f"hydra.run.dir={replay}"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=600)
    a = torch.load(run_dir_of(sweep, best.number) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(replay / "checkpoints" / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 540
    for k in a["model"]:  # bit for bit in one process (test_scheduler_units); here the job's CPU threads may differ
        assert torch.allclose(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6), k
