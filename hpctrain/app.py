"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import time
from pathlib import Path
from typing import Any, Dict

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain import runfiles
from hpctrain.config import register_configs
from hpctrain.validate import validate_job

log = logging.getLogger("hpctrain")
register_configs()


def train(cfg: DictConfig) -> Dict[str, Any]:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    record = runfiles.read_metrics(run_dir)
    if record and record.get("status") == runfiles.COMPLETED:
        log.info("%s already completed at step %s: nothing to do", run_dir, record.get("step"))
        return record

    problems = validate_job(cfg)
    if problems:
        raise ValueError("; ".join(problems))

    from hpctrain.distributed import init_distributed, teardown
    from hpctrain.trainer import Trainer, error_tail

    info = init_distributed(cfg.device)
    try:
        trainer = Trainer(cfg, run_dir, info)
        result = trainer.fit()
        log.info("run %s: step %d, train/loss %.4f", run_dir, result["step"], result["metrics"].get("train/loss", float("nan")))
        return result
    except Exception as exc:
        # every rank may write: the write is atomic and each holds a real error
        runfiles.update_metrics(run_dir, status=runfiles.FAILED, error=error_tail(exc), failed_rank=info.rank,
                                failed_at=time.time())
        raise
    finally:
        teardown()


# The launcher calls this on the login node for every sweep point before submitting anything.
train.validate_job = validate_job  # type: ignore[attr-defined]

main = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train)
