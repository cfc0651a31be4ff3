"""What runs on the compute node: one sweep point, composed by Hydra and run with ``run_job``.

The callable is small (a payload path); the heavy shared state (Hydra context, task function, sweep
config) is pickled once per launch into the sweep dir, not once per run. It is a submitit
checkpointable: on preemption or time limit the same call is requeued, and the app resumes from its
checkpoint.

Every rank records its own outcome in the run record (:mod:`hpctrain.core.events`): rank 0 the start and
the completion (the task function's return value becomes the run's metrics), any rank whose task
raised its error. Retries are decided once per attempt, after all its tasks ended (``ended.py``, or the
local launcher), so a crash of any rank counts the same.
"""

import os
import sys
from pathlib import Path
from typing import Any, Dict

import cloudpickle
import submitit
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import open_dict

from hpctrain._compat.hydra import stored_value
from hpctrain._compat.submitit import private_pickles
from hpctrain.core import events
from hpctrain.core import paths as runfiles
from hpctrain.core import safefs, summary
from hpctrain.core.errors import DiskFullError
from hpctrain.core.run import RunSpec
from hpctrain.job.sampler import Sampler

private_pickles()  # the result pickle this job writes (the launcher reads it) not writable by the group

SAMPLE_EVERY_S = float(os.environ.get("HPCTRAIN_SAMPLE_EVERY_S", "5"))  # utilisation sampling (job/sampler.py)


def save_payload(path: Path, hydra_context: Any, task_function: Any, config: Any) -> None:
    runfiles.write_bytes_atomic(path, cloudpickle.dumps((hydra_context, task_function, config, Singleton.get_state())),
                                safefs.exec_file_mode())  # unpickled by every task: writable by the user alone


class SweepJob:
    def __init__(self, payload: str, sweep_dir: str, app: str = "") -> None:
        self.payload = payload
        self.sweep_dir = sweep_dir
        self.app = app  # the task function's fingerprint: a rerun of the same code skips completed runs

    def __call__(self, run: Dict[str, Any]) -> JobReturn:
        """One run, as the plan decided it (:meth:`RunSpec.to_json`): Hydra's output dir is its run dir."""
        spec = RunSpec.from_json(run, Path(self.sweep_dir))
        try:
            return self._run(spec)
        except DiskFullError as full:  # a write of the wrapper's own (the record, metrics.json) or the task's
            if not getattr(full, "said", False):
                say(f"hpctrain: run {spec.name} failed: {full}")
                try:
                    events.failed(spec.run_dir, _error_tail(full), rank=submitit.JobEnvironment().global_rank)
                except OSError:
                    pass
            raise

    def _run(self, spec: RunSpec) -> JobReturn:
        run_dir = str(spec.run_dir)
        if events.is_completed(run_dir, self.app):  # done by another job of the sweep: nothing to start
            return (summary.read(run_dir) or {}).get("metrics")
        env = submitit.JobEnvironment()
        os.environ[events.RECORDED_ENV] = "1"
        if env.global_rank == 0:
            events.started(run_dir, job_id=env.job_id, host=env.hostname)
        with open(self.payload, "rb") as f:
            hydra_context, task_function, config, singleton_state = cloudpickle.load(f)
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(spec.overrides))
        with open_dict(sweep_config.hydra):
            sweep_config.hydra.job.id = env.job_id
            sweep_config.hydra.job.num = spec.idx
            # the planned dir, not hydra.sweep.subdir resolved again here (job id, resolvers, clock)
            sweep_config.hydra.run.dir = run_dir
        HydraConfig.instance().set_config(sweep_config)
        with Sampler(run_dir, interval_s=SAMPLE_EVERY_S, write_tb=env.global_rank == 0) as sampler:
            ret = run_job(
                hydra_context=hydra_context,
                task_function=task_function,
                config=sweep_config,
                job_dir_key="hydra.run.dir",
                job_subdir_key=None,
            )
        if env.global_rank == 0 and sampler.stats.n:
            summary.write(run_dir, sys=sampler.summary())
        if ret.status == JobStatus.COMPLETED:
            if env.global_rank == 0:
                self._completed(run_dir, ret.return_value, self.app)
            return ret
        exc = stored_value(ret)
        if isinstance(exc, DiskFullError):  # first, in the job's log: the record may not be writable
            say(f"hpctrain: run {spec.name} failed: {exc}")
            exc.said = True  # type: ignore[attr-defined]
        try:
            if isinstance(exc, submitit.core.utils.UncompletedJobError):  # submitit gave up at the time limit
                events.timed_out(run_dir, str(exc), rank=env.global_rank)
            else:
                events.failed(run_dir, _error_tail(exc), rank=env.global_rank, job_id=env.job_id)
            summary.write(run_dir)  # the batch script (or local launcher) writes it again once all ranks ended
        except DiskFullError as full:
            say(f"hpctrain: run {spec.name}: its failure cannot be recorded: {full}")
        return ret.return_value  # re-raises the task's exception: a non-zero exit ends the step

    @staticmethod
    def _completed(run_dir: str, value: Any, app: str) -> None:
        """The return value (a number or a dict of numbers) becomes the run's final metrics, unless the
        app wrote its own (hpctrain's trainer does)."""
        done = summary.read(run_dir) or {}
        fields = {} if done.get("metrics") else {"metrics": summary.numbers(value)}
        events.completed(run_dir, app=app)
        summary.write(run_dir, **fields)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2 (rank 0): requeue the same call; the app resumes from its checkpoint."""
        run = args[0] if args else kwargs["run"]
        run_dir = RunSpec.from_json(run, Path(self.sweep_dir)).run_dir
        if events.requeued(run_dir) is None:  # the record is final (completed, cancelled): never run it again
            summary.write(run_dir)
            raise SystemExit(0)
        summary.write(run_dir)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def say(line: str) -> None:
    """A line on stderr (the job's log), which may itself sit on the full disk."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _error_tail(exc: BaseException, lines: int = 15) -> str:
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])
