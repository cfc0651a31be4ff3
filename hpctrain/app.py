"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import time
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain import runfiles
from hpctrain.config import register_configs
from hpctrain.validate import validate_job

log = logging.getLogger("hpctrain")
register_configs()


def objective_value(record: Optional[Dict[str, Any]]) -> float:
    """The number Hydra's search sweepers (Optuna, Nevergrad, Ax) read: the run's objective, NaN if none."""
    value = ((record or {}).get("objective") or {}).get("value")
    return float(value) if isinstance(value, (int, float)) else float("nan")


def train(cfg: DictConfig) -> float:
    """One run; returns its objective value (metrics.json holds the whole result)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    record = runfiles.read_metrics(run_dir)
    if record and record.get("status") == runfiles.COMPLETED:
        log.info("%s already completed at step %s: nothing to do", run_dir, record.get("step"))
        return objective_value(record)

    problems = validate_job(cfg)
    if problems:
        raise ValueError("; ".join(problems))

    from hpctrain.distributed import init_distributed, teardown
    from hpctrain.trainer import Trainer

    attempt_started = time.time()
    info = init_distributed(cfg.device)
    try:
        trainer = Trainer(cfg, run_dir, info)
        result = trainer.fit()
        objective = result["objective"]
        log.info("run %s: step %d, %s %s", run_dir, result["step"], objective["metric"], objective["value"])
        return objective_value(result)
    except Exception as exc:
        record_failure(run_dir, exc, info.rank, attempt_started)
        raise
    finally:
        teardown()


# What a rank sees when another rank of the job died (gloo, NCCL): the fallout, not the cause.
_FALLOUT = ("Connection closed by peer", "Connection reset by peer", "remote worker", "NCCL communicator",
            "Watchdog caught collective operation timeout", "DistBackendError")


def record_failure(run_dir: Path, exc: BaseException, rank: int, attempt_started: float) -> None:
    """metrics.json says failed with the error that caused it: a rank's own error wins over the
    collective errors the other ranks then see, whichever rank gets there first."""
    from hpctrain.trainer import error_tail

    error = error_tail(exc)
    fallout = any(marker in f"{type(exc).__name__}: {exc}" for marker in _FALLOUT)
    if fallout:
        time.sleep(2.0)  # let the failing rank record its own error first
    record = runfiles.read_metrics(run_dir) or {}
    this_attempt = record.get("status") == runfiles.FAILED and record.get("failed_at", 0) >= attempt_started
    if this_attempt and (fallout or not record.get("fallout")):
        log.error("rank %d failed too: %s", rank, error.splitlines()[-1] if error else exc)
        return
    runfiles.update_metrics(run_dir, status=runfiles.FAILED, error=error, failed_rank=rank, fallout=fallout,
                            failed_at=time.time())


# The launcher calls this on the login node for every sweep point before submitting anything.
train.validate_job = validate_job  # type: ignore[attr-defined]

main = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train)
