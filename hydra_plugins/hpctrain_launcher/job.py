"""What runs on the compute node: one sweep point, composed by Hydra and run with ``run_job``.

The callable is small (a payload path, the retry budget); the heavy shared state (Hydra context,
task function, sweep config) is pickled once per launch into the sweep dir, not once per run.
It is a submitit checkpointable: on preemption or time limit the same call is requeued, and the
app resumes from its checkpoint.
"""

import sys
from pathlib import Path
from typing import Any, List

import cloudpickle
import submitit
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobStatus, run_job, setup_globals
from omegaconf import open_dict

from hpctrain import runfiles


def save_payload(path: Path, hydra_context: Any, task_function: Any, config: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        cloudpickle.dump((hydra_context, task_function, config, Singleton.get_state()), f)
    tmp.replace(path)


class SweepJob:
    def __init__(self, payload: str, sweep_dir: str, max_retries: int) -> None:
        self.payload = payload
        self.sweep_dir = sweep_dir
        self.max_retries = max_retries

    def __call__(self, idx: int, overrides: List[str]) -> Any:
        env = submitit.JobEnvironment()
        if env.global_rank == 0:
            runfiles.append_event(Path(self.sweep_dir), idx, "start", job_id=env.job_id)
        with open(self.payload, "rb") as f:
            hydra_context, task_function, config, singleton_state = cloudpickle.load(f)
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = env.job_id
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        ret = run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        timed_out = isinstance(ret._return_value, submitit.core.utils.UncompletedJobError)
        if ret.status == JobStatus.FAILED and env.global_rank == 0 and not timed_out:
            self._retry_or_fail(env, idx, ret)  # a crash; not submitit giving up at the time limit
        return ret.return_value  # re-raises the task's exception when it failed

    def _retry_or_fail(self, env: submitit.JobEnvironment, idx: int, ret: Any) -> None:
        sweep_dir = Path(self.sweep_dir)
        events = runfiles.read_events(sweep_dir, idx)
        since = max((i for i, e in enumerate(events) if e["event"] == "submitted"), default=-1)
        failures = sum(e["event"] == "failed" for e in events[since + 1 :])  # this submission's only
        runfiles.append_event(sweep_dir, idx, "failed", job_id=env.job_id, error=repr(ret._return_value)[:500])
        if failures >= self.max_retries:
            return  # out of retries: the run ends failed (metrics.json says so)
        run_dir = Path(ret.hydra_cfg.hydra.runtime.output_dir)  # run_job sets it before the task starts
        if (run_dir / runfiles.METRICS).exists():
            runfiles.update_metrics(run_dir, status=runfiles.RETRYING, retry=failures + 1)
        runfiles.append_event(sweep_dir, idx, "retry", attempt=failures + 1, of=self.max_retries)
        print(f"hpctrain: run {idx} failed; requeued (retry {failures + 1} of {self.max_retries})", file=sys.stderr)
        env._requeue(countdown=self.max_retries - failures)  # scontrol requeue / local controller restart
        sys.exit(1)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2 (rank 0): requeue the same call; the app resumes from its checkpoint."""
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
