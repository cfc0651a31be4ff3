"""The time-limit requeue on the test cluster, bare (tests/test_slurm_paths.py) and in the container
(tests/test_container_matrix.py): one sweep, one wait and one comparison with the uninterrupted run."""

import re
from pathlib import Path
from typing import List

import torch

from slurm_helpers import metrics, record_kinds, run_dirs, wait_for
from trainer_helpers import compose, state_close

# over 50 s of training: the 1-minute limit's USR2 comes 15 to 45 s in (slurmctld checks limits every 30 s)
SLOW = ["max_steps=2500", "log_every=50", "eval_every=0", "ckpt_every=0", "model._target_=user_models.SlowDropout"]


def requeue_args(sweep: Path) -> List[str]:
    """A sweep of one SLOW run under a 1-minute limit, USR2 15 s before it; its model sleeps in its first
    attempt only (the delay changes no number)."""
    return ["-m", *SLOW, "+model.delay_s=0.02", "+model.first_attempt_only=true", "hydra/launcher=slurm",
            "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=15", "hydra.launcher.max_num_timeout=8",
            f"hydra.sweep.dir={sweep}"]


def requeued_to_completion(sweep: Path, timeout: float = 540) -> Path:
    """The run of ``requeue_args``: checkpointed at submitit's USR2, requeued by the host side, resumed at
    that step, completed; its run dir."""
    wait_for(lambda: len(run_dirs(sweep)) == 1, 120, "the run to start")
    (run_dir,) = run_dirs(sweep)
    wait_for(lambda: metrics(run_dir).get("status") in ("completed", "failed", "timeout"), timeout,
             "the run to end", every=2)
    assert metrics(run_dir)["status"] == "completed", metrics(run_dir)
    kinds = record_kinds(run_dir)
    assert kinds.count("requeued") >= 1 and kinds[-1] == "completed" and "failed" not in kinds, kinds
    resumed = [int(n) for n in re.findall(r"resumed from \S+ at step (\d+)", (run_dir / "hpctrain.log").read_text())]
    assert resumed and 0 < resumed[0] < 2500, resumed  # the step it checkpointed at on USR2
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.*"))
    assert "this job is timed-out" in logs and "requeued by the host side" in logs  # submitit's requeue, asked
    assert "No such file or directory: 'scontrol'" not in logs
    return run_dir


def matches_uninterrupted(run_dir: Path, scratch: Path) -> None:
    """The requeued run's final weights equal those of the same run never interrupted (trained here)."""
    from hpctrain.train.distributed import DistInfo
    from hpctrain.train.trainer import Trainer

    reference = Trainer(compose(SLOW + ["+model.delay_s=0"]), scratch / "reference", DistInfo())
    reference.fit()
    done = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert done["step"] == 2500
    assert state_close(done["model"], reference.raw_model.state_dict(), atol=0)
