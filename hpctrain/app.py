"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import os
from pathlib import Path
from typing import Any, Dict

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain import record, runfiles
from hpctrain.config import register_configs
from hpctrain.validate import validate_job

log = logging.getLogger("hpctrain")
register_configs()


def train(cfg: DictConfig) -> Dict[str, Any]:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if record.is_completed(run_dir):
        summary = runfiles.read_metrics(run_dir) or {}
        log.info("%s already completed at step %s: nothing to do", run_dir, summary.get("step"))
        return summary

    problems = validate_job(cfg)
    if problems:
        raise ValueError("; ".join(problems))

    from hpctrain.distributed import init_distributed, teardown
    from hpctrain.trainer import Trainer

    info = init_distributed(cfg.device)
    own_record = info.is_main and not os.environ.get(record.RECORDED_ENV)  # run mode: no job wrapper
    if own_record:
        record.started(run_dir)
    try:
        trainer = Trainer(cfg, run_dir, info)
        result = trainer.fit()
        if own_record:
            record.completed(run_dir)
            record.write_summary(run_dir)
        log.info("run %s: step %d, train/loss %.4f", run_dir, result["step"], result["metrics"].get("train/loss", float("nan")))
        return result
    except Exception as exc:
        record_failure(run_dir, exc, info.rank)
        raise
    finally:
        teardown()


def record_failure(run_dir: Path, exc: BaseException, rank: int) -> None:
    """This rank's error in the run record; the record, not the order of writing, decides that a rank's
    own error wins over the collective fallout the other ranks see. Under hpctrain's launchers the job
    wrapper records it (for any app); in run mode the app does."""
    if os.environ.get(record.RECORDED_ENV):
        return
    from hpctrain.trainer import error_tail

    record.failed(run_dir, error_tail(exc), rank=rank)
    record.write_summary(run_dir)


# The launcher calls this on the login node for every sweep point before submitting anything.
train.validate_job = validate_job  # type: ignore[attr-defined]
# Packed runs (runs_per_task > 1) are forked from one process per task that imports these first.
train.preload = ("hpctrain.trainer", "hpctrain.distributed")  # type: ignore[attr-defined]

main = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train)
