"""The Hydra task: build from the config, train, and leave metrics.json behind whatever happens.

Imported on login nodes (it is the Hydra app), so torch is imported only inside ``train``.
"""

import logging
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain.core import events
from hpctrain.core.app_contract import AppContract, attach
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
    from hpctrain.job import lifecycle

    owner = lifecycle.current()  # the job wrapper's or the search worker's; None: run directly
    for warning in unread_keys(cfg) if owner is None else ():  # run mode: said here (the launcher said it)
        log.warning(warning)

    from hpctrain.job import direct, heartbeat
    from hpctrain.job.preemption import PreemptionGuard
    from hpctrain.search import bridge
    from hpctrain.train.distributed import init_distributed, ranks, teardown
    from hpctrain.train.trainer import Trainer

    info, failed = None, True
    own: Optional[lifecycle.Lifecycle] = None
    dog = direct.begin(cfg, run_dir) if owner is None else None  # run mode: watched all the same
    heart = heartbeat.for_this_rank(*ranks())  # from here on (setup) the watchdog sees this rank
    try:
        info = init_distributed(cfg.device)  # inside: a GPU job without CUDA is recorded failed too
        heart.check_watched()  # every rank of the node has started by now, its watchdog's starter first
        if owner is None:  # run mode (python -m hpctrain, torchrun): this run's life is the app's own
            own = lifecycle.Lifecycle(run_dir, rank=info.rank)
            own.begin()
        trial = bridge.current()  # the search trial this run is, or None
        with lifecycle.active(own) if own is not None else nullcontext():
            trainer = Trainer(cfg, run_dir, info, hooks=[PreemptionGuard(run_dir), *([trial] if trial else [])])
            result = trainer.fit()
        if own is not None:
            own.end(lifecycle.Outcome.COMPLETED)
        objective = result["objective"]
        log.info("run %s: step %d, %s %s", run_dir, result["step"], objective["metric"], objective["value"])
        failed = False
        return objective_value(result)
    except Exception as exc:
        if owner is None:  # under a launcher the owner records it (for any app)
            mine = own or lifecycle.Lifecycle(run_dir, rank=info.rank if info else int(os.environ.get("RANK", 0)))
            mine.end(lifecycle.Outcome.FAILED, error=lifecycle.error_tail(exc))
        raise
    finally:
        heart.close()
        direct.end(dog)
        teardown(failed)  # after a failure: abort, never wait on ranks that may be gone


# What the launcher, the search sweeper and the packed runner know of this app (hpctrain.core.app_contract).
attach(train, AppContract(
    validate=validate_job,  # every sweep point, on the login node, before anything is submitted
    unread_keys=unread_keys,
    mutable_keys=frozenset(RETUNABLE),  # the keys Trainer.retune applies on resume: what scheduler=pbt may explore
    preload=("hpctrain.train.trainer", "hpctrain.train.distributed"),  # imported once per packed task, before its fork
    objective_metric="val/loss",
    gpu_per_rank=True,
))

main = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train)
