"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain.core import events
from hpctrain.core import summary
from hpctrain.submit.checks import unread_keys, validate_job
from hpctrain.schema import RETUNABLE, register_configs

log = logging.getLogger("hpctrain")
register_configs()


def objective_value(summary_of_run: Optional[Dict[str, Any]]) -> float:
    """The number Hydra's search sweepers (Optuna, Nevergrad, Ax) read: the run's objective, NaN if none."""
    value = ((summary_of_run or {}).get("objective") or {}).get("value")
    return float(value) if isinstance(value, (int, float)) else float("nan")


def train(cfg: DictConfig) -> float:
    """One run; returns its objective value (metrics.json holds the whole result)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if events.is_completed(run_dir):
        done = summary.read(run_dir) or {}
        log.info("%s already completed at step %s: nothing to do", run_dir, done.get("step"))
        return objective_value(done)

    problems = validate_job(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    for warning in unread_keys(cfg) if not os.environ.get(events.RECORDED_ENV) else ():  # run mode: said here
        log.warning(warning)

    from hpctrain.job.preemption import PreemptionGuard
    from hpctrain.search import bridge
    from hpctrain.train.distributed import init_distributed, teardown
    from hpctrain.train.trainer import Trainer

    info, failed = None, True
    try:
        info = init_distributed(cfg.device)  # inside: a GPU job without CUDA is recorded failed too
        own_record = info.is_main and not os.environ.get(events.RECORDED_ENV)  # run mode: no job wrapper
        if own_record:
            events.started(run_dir)
        trial = bridge.current()  # the search trial this run is, or None
        trainer = Trainer(cfg, run_dir, info, hooks=[PreemptionGuard(run_dir), *([trial] if trial else [])])
        result = trainer.fit()
        if own_record:
            events.completed(run_dir)
            summary.write(run_dir)
        objective = result["objective"]
        log.info("run %s: step %d, %s %s", run_dir, result["step"], objective["metric"], objective["value"])
        failed = False
        return objective_value(result)
    except Exception as exc:
        record_failure(run_dir, exc, info.rank if info else int(os.environ.get("RANK", 0)))
        raise
    finally:
        teardown(failed)  # after a failure: abort, never wait on ranks that may be gone


def record_failure(run_dir: Path, exc: BaseException, rank: int) -> None:
    """This rank's error in the run record; the record, not the order of writing, decides that a rank's
    own error wins over the collective fallout the other ranks see. Under hpctrain's launchers the job
    wrapper records it (for any app); in run mode the app does."""
    if os.environ.get(events.RECORDED_ENV):
        return
    from hpctrain.train.trainer import error_tail

    events.failed(run_dir, error_tail(exc), rank=rank)
    summary.write(run_dir)


# The launcher calls this on the login node for every sweep point before submitting anything.
train.validate_job = validate_job  # type: ignore[attr-defined]
train.unread_keys = unread_keys  # type: ignore[attr-defined]
# The keys the trainer applies on resume (Trainer.retune): what scheduler=pbt may explore.
train.mutable_keys = RETUNABLE  # type: ignore[attr-defined]
# Packed runs (runs_per_task > 1) are forked from one process per task that imports these first.
train.preload = ("hpctrain.train.trainer", "hpctrain.train.distributed")  # type: ignore[attr-defined]

main = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train)
