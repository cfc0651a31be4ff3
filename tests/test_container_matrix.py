"""The container matrix of issue 27, the cases not already parametrized over bare/container elsewhere.

tests/test_slurm.py (a sweep, USR2 requeue bit-exact, max_retries after a crash), tests/test_preempt_term.py
(SIGTERM with the job running, packed, a plain scancel) and tests/test_preemption_real.py (a real preemption
from ``urgent`` with a grace time, and packed without one) run bare and inside the test container (tests/helpers/isolation.py),
which hides Slurm's client and munge socket from the job. Here: the time limit and a search, in the container
(their bare runs: tests/test_slurm_paths.py and tests/test_search.py's local study with the same stale owners).
"""

import json

import pytest
import torch

from cli_helpers import run_hpctrain
from isolation import mode_for, ran_contained
from slurm_helpers import cancel, job_id, metrics, record_kinds, run_dirs, wait_for
from test_search import TINY, _stale_trials, run_dir_of, search, trials
from trainer_helpers import compose, state_close

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SLOW = ["max_steps=2500", "log_every=50", "eval_every=0", "ckpt_every=0", "model._target_=user_models.SlowDropout"]


def test_a_time_limit_in_the_container_requeues_and_resumes_bit_exact(tmp_path):
    """timeout_min=1, signal_delay_s=15: submitit's USR2 before the limit, the checkpoint, the requeue
    asked of the host side (no scontrol in the image), and the resumed run ends with the weights of an
    uninterrupted one."""
    mode = mode_for("container", tmp_path)
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", *SLOW, "+model.delay_s=0.02", "+model.first_attempt_only=true", "hydra/launcher=slurm",
                  "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=15",
                  "hydra.launcher.max_num_timeout=8", f"hydra.sweep.dir={sweep}", *mode.args],
                 cwd=tmp_path, timeout=60, env=mode.env)
    job = job_id(sweep)
    try:
        wait_for(lambda: len(run_dirs(sweep)) == 1, 120, "the run to start")
        (run_dir,) = run_dirs(sweep)
        wait_for(lambda: metrics(run_dir).get("status") in ("completed", "failed", "timeout"), 300,
                 "the run to end", every=2)
        assert metrics(run_dir)["status"] == "completed", metrics(run_dir)
        kinds = record_kinds(run_dir)
        assert kinds.count("requeued") >= 1 and kinds[-1] == "completed" and "failed" not in kinds, kinds
        logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.*"))
        assert "this job is timed-out" in logs and "requeued by the host side" in logs
        assert "No such file or directory: 'scontrol'" not in logs
        assert ran_contained(tmp_path)
    finally:
        cancel(job)
    from hpctrain.train.distributed import DistInfo
    from hpctrain.train.trainer import Trainer

    reference = Trainer(compose(SLOW + ["+model.delay_s=0"]), tmp_path / "reference", DistInfo())
    reference.fit()
    done = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert done["step"] == 2500
    assert state_close(done["model"], reference.raw_model.state_dict(), atol=0)


def test_search_workers_in_the_container_ask_the_queue_on_the_host_and_adopt_dead_owners_trials(tmp_path):
    """Two trials held by Slurm jobs long gone (as the same command run again after its workers were
    scancelled finds them): two workers in the image, which has no squeue, learn from the host side that the
    owners left the queue and adopt both; in the image itself the answer was "unknown" forever."""
    mode = mode_for("container", tmp_path)
    sweep = tmp_path / "sweep"
    _stale_trials(sweep, ["999998", "999999"])
    run_hpctrain(search(sweep, "lr=tag(log,interval(1e-4,1e-1))", "hydra.sweeper.n_trials=4",
                        "hydra.sweeper.n_workers=2", *TINY, "hydra.launcher.wait=true", *mode.args),
                 cwd=tmp_path, env=mode.env, timeout=600)
    found = trials(sweep)
    assert sorted(t.number for t in found) == [0, 1, 2, 3]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in found), [(t.number, t.state) for t in found]
    for t in found[:2]:
        starts = [json.loads(p.read_text())
                  for p in (run_dir_of(sweep, t.number) / ".hpctrain" / "record").glob("*.started.*")]
        assert [s["how"] for s in starts] == ["adopted"], (t.number, starts)
    assert ran_contained(tmp_path)
