"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import os
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
    from hpctrain.trainer import Trainer

    attempt_started = time.time()
    info, failed = None, True
    try:
        info = init_distributed(cfg.device)  # inside: a GPU job without CUDA is recorded failed too
        trainer = Trainer(cfg, run_dir, info)
        result = trainer.fit()
        log.info("run %s: step %d, train/loss %.4f", run_dir, result["step"], result["metrics"].get("train/loss", float("nan")))
        failed = False
        return result
    except Exception as exc:
        record_failure(run_dir, exc, info.rank if info else int(os.environ.get("RANK", 0)), attempt_started)
        raise
    finally:
        teardown(failed)  # after a failure: abort, never wait on ranks that may be gone


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
