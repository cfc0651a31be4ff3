"""scheduler=pbt on the real test cluster: a population of 4 over 3 intervals, its exploits, lineage,
TensorBoard curves and the replay of the best trial's schedule as one run."""

import shlex
from pathlib import Path

import pytest
import torch

from cli_helpers import run_hpctrain
from slurm_helpers import cancel, job_id, queued, wait_for

from hpctrain.core import summary
from hpctrain.search import exploit, pbt

STEPS = ["max_steps=15", "eval_every=5", "log_every=5", "ckpt_every=5", "warmup_steps=0", "min_lr_ratio=1.0",
         "data.train_size=256", "data.val_size=64", "model.hidden=16"]


def scalars(run_dir: Path, tag: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def model_of(path: Path) -> dict:
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slurm
def test_pbt_population_of_4_over_3_intervals(tmp_path, slurm_cluster):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "hydra/sweeper=search", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
                  "lr=tag(log,interval(1e-3,1e-1))", "hydra.sweeper.scheduler=pbt", "hydra.sweeper.population=4",
                  "hydra.sweeper.n_trials=4", "hydra.sweeper.interval=5", "hydra.sweeper.n_workers=2",
                  "hydra.sweeper.seed=0", *STEPS], cwd=tmp_path, timeout=60)
    job = job_id(sweep)
    try:
        wait_for(lambda: not queued(job), 600, "the workers to finish the population")
    finally:
        cancel(job)
    dirs = {n: exploit.trial_dir(sweep, n, {}) for n in range(4)}
    assert len([p for p in sweep.iterdir() if p.name.startswith("trial-")]) == 4  # one dir per member
    found = {n: summary.read(d) for n, d in dirs.items()}
    assert all(m["status"] == "completed" and m["step"] == 15 for m in found.values())
    lineages = {n: m["lineage"] for n, m in found.items()}
    assert all([e["step"] for e in lin] == [0, 5, 10] for lin in lineages.values())
    assert all(1e-3 <= e["params"]["lr"] <= 1e-1 for lin in lineages.values() for e in lin)
    exploits = [(n, e["step"], e["parent"]) for n, lin in lineages.items() for e in lin if e["parent"] is not None]
    assert {s for _, s, _ in exploits} == {5, 10}  # the bottom quarter (one member) exploits at each boundary

    # the exploit at step 10 (both boundaries still kept): the member's checkpoint there is the donor's
    (me, _, donor), = [x for x in exploits if x[1] == 10]
    mine, theirs = model_of(exploit.kept_dir(dirs[me], 10) / "last.pt"), model_of(exploit.kept_dir(dirs[donor], 10) / "last.pt")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert torch.load(exploit.kept_dir(dirs[donor], 10) / "last.pt", weights_only=True)["step"] == 10
    assert (dirs[donor] / "checkpoints" / "last.pt").exists()  # the donor's own files stay
    # one TensorBoard run per trial, its curve continuous across the exploits
    for d in dirs.values():
        assert sorted(scalars(d, "train/loss")) == [5, 10, 15]
        assert sorted(scalars(d, "val/loss")) == [5, 10, 15]

    proc = run_hpctrain(["report", str(sweep)], cwd=tmp_path, timeout=300)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("replay as one run: ")]
    command = line[len("replay as one run: "):].split(" && ")[-1]
    (best_line,) = [x for x in proc.stdout.splitlines() if x.startswith("best: #")]
    best = int(best_line.split("#")[1].split()[0])
    sched = pbt.schedule(best, lineages)
    assert (sweep / "pbt_schedules.png").stat().st_size > 0
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "hpctrain"]
    replay = tmp_path / "replay"
    run_hpctrain(args[3:] + [f"hydra.run.dir={replay}"], cwd=tmp_path, timeout=300)
    lr = scalars(replay, "train/lr")

    def planned(step):  # the lr logged at a step is the one of the update that made it
        return [e for e in sched if e["step"] < step][-1]["params"]["lr"]

    assert sorted(lr) == [5, 10, 15]
    assert all(lr[s] == pytest.approx(planned(s), rel=1e-6) for s in lr)
    own = scalars(dirs[best], "train/lr")
    since = max([e["step"] for e in lineages[best] if e["parent"] is not None], default=0)
    assert all(lr[s] == pytest.approx(own[s], rel=1e-6) for s in own if s > since)  # as the trial recorded
    a, b = model_of(replay / "checkpoints" / "last.pt"), model_of(dirs[best] / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same weights: the exploits took the donors' exactly
    # a member that exploited, replayed from its schedule (its donor's values up to the copy): the same weights
    exploiter = tmp_path / "exploiter"
    run_hpctrain(STEPS + pbt.replay_overrides(pbt.schedule(me, lineages)) + [f"hydra.run.dir={exploiter}"],
                 cwd=tmp_path, timeout=300)
    a, b = model_of(exploiter / "checkpoints" / "last.pt"), model_of(dirs[me] / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len(pbt.schedule(me, lineages)) >= 2  # its donor's values, then its own explored ones
