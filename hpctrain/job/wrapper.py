"""What runs on the compute node: one sweep point, composed by Hydra and run with ``run_job``.

The callable is small (a payload path); the heavy shared state (Hydra context, task function, sweep
config) is pickled once per launch into the sweep dir, not once per run. It is a submitit
checkpointable: on preemption or time limit the same call is requeued, and the app resumes from its
checkpoint.

The run's life is the wrapper's (:mod:`hpctrain.job.lifecycle`: begin, one decision at the end, requeue),
current while the task function runs: rank 0 records the start and the completion (the task function's
return value becomes the run's metrics), any rank whose task raised its error. Retries are decided once per
attempt, after all its tasks ended (``attempt_ended.py``, or the local launcher), so a crash of any rank
counts the same.
"""

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import cloudpickle
import submitit
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, run_job
from omegaconf import open_dict

from hpctrain._compat.submitit import private_pickles
from hpctrain.core.atomic import write_bytes_atomic
from hpctrain.core import safefs, summary
from hpctrain.core.errors import DiskFullError
from hpctrain.core.run import RunSpec
from hpctrain.job import heartbeat, watchdog
from hpctrain.job.lifecycle import Lifecycle, Outcome, active, error_tail, load_payload, outcome_of, requeue, say
from hpctrain.job.sampler import Sampler

private_pickles()  # the result pickle this job writes (the launcher reads it) not writable by the group

SAMPLE_EVERY_S = float(os.environ.get("HPCTRAIN_SAMPLE_EVERY_S", "5"))  # utilisation sampling (job/sampler.py)


def save_payload(path: Path, hydra_context: Any, task_function: Any, config: Any) -> None:
    write_bytes_atomic(path, cloudpickle.dumps((hydra_context, task_function, config, Singleton.get_state())),
                                safefs.exec_file_mode())  # unpickled by every task: writable by the user alone


class SweepJob:
    compose: Optional[Callable[[List[str]], Any]] = None  # a pull worker's composer (search/compose.py), set there

    def __init__(self, payload: str, sweep_dir: str, app: str = "") -> None:
        self.payload = payload
        self.sweep_dir = sweep_dir
        self.app = app  # the task function's fingerprint: a rerun of the same code skips completed runs

    def __call__(self, run: Dict[str, Any]) -> "JobReturn | Dict[str, Any] | None":
        """One run, as the plan decided it (:meth:`RunSpec.to_json`): Hydra's output dir is its run dir.
        Hydra's ``JobReturn``; for a run completed before, its metrics."""
        spec = RunSpec.from_json(run, Path(self.sweep_dir))
        life = Lifecycle(spec.run_dir, app=self.app)
        if life.completed_before():  # done by another job of the sweep: nothing to start
            return (summary.read(spec.run_dir) or {}).get("metrics")
        env = submitit.JobEnvironment()
        life.rank, life.job_id = env.global_rank, env.job_id
        try:
            with active(life):
                return self._run(spec, life, env)
        except DiskFullError as full:  # a write of the wrapper's own (the record, metrics.json) or the task's
            if not life.said:
                say(f"hpctrain: run {spec.name} failed: {full}")
                try:
                    life.end(Outcome.FAILED, error=error_tail(full))
                except OSError:
                    pass
            raise

    def _run(self, spec: RunSpec, life: Lifecycle, env: submitit.JobEnvironment) -> "JobReturn | Dict[str, Any] | None":
        run_dir = str(spec.run_dir)
        if not life.begin(host=env.hostname):  # completed meanwhile by another job of the sweep
            return (summary.read(run_dir) or {}).get("metrics")
        payload = self.loaded()
        compose = self.compose  # a pull worker's: composed once per base, not per point
        sweep_config = compose(list(spec.overrides)) if compose is not None else \
            payload.hydra_context.config_loader.load_sweep_config(payload.config, list(spec.overrides))
        with open_dict(sweep_config.hydra):
            sweep_config.hydra.job.id = env.job_id
            sweep_config.hydra.job.num = spec.idx
            # the planned dir, not hydra.sweep.subdir resolved again here (job id, resolvers, clock)
            sweep_config.hydra.run.dir = run_dir
        HydraConfig.instance().set_config(sweep_config)
        beats = heartbeat.dir_for(run_dir, str(env.job_id))
        settings = watchdog.settings_of(sweep_config, beats, spec.run_dir, str(env.job_id), nodes=env.num_nodes)
        dog = watchdog.start(settings) if settings is not None and env.local_rank == 0 else None  # one per node
        if settings is not None:
            os.environ[heartbeat.DIR_ENV] = str(beats)  # the trainer's heartbeat (hpctrain.job.heartbeat)
        try:
            with Sampler(run_dir, interval_s=SAMPLE_EVERY_S, write_tb=env.global_rank == 0) as sampler:
                ret = run_job(
                    hydra_context=payload.hydra_context,
                    task_function=payload.task_function,
                    config=sweep_config,
                    job_dir_key="hydra.run.dir",
                    job_subdir_key=None,
                )
        finally:
            os.environ.pop(heartbeat.DIR_ENV, None)
            watchdog.stop(dog)
        if env.global_rank == 0 and sampler.stats.n:
            summary.write(run_dir, sys=sampler.summary())
        outcome, exc = outcome_of(ret)
        if exc is None:
            self._completed(life, ret.return_value)
            return ret
        if isinstance(exc, DiskFullError):  # first, in the job's log: the record may not be writable
            say(f"hpctrain: run {spec.name} failed: {exc}")
            life.said = True
        try:
            life.failed(exc)  # the batch script (or local launcher) writes the summary again once all ranks ended
        except DiskFullError as full:
            say(f"hpctrain: run {spec.name}: its failure cannot be recorded: {full}")
        return ret.return_value  # re-raises the task's exception: a non-zero exit ends the step

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_loaded", None)  # a requeue pickles the job again: the payload stays in its own file
        state.pop("compose", None)
        return state

    def loaded(self) -> Any:
        """The payload, unpickled once per process (a pull worker runs many points)."""
        if getattr(self, "_loaded", None) is None:
            self._loaded = load_payload(self.payload)
        return self._loaded

    @staticmethod
    def _completed(life: Lifecycle, value: Any) -> None:
        """The return value (a number or a dict of numbers) becomes the run's final metrics, unless the
        app wrote its own (hpctrain's trainer does)."""
        done = summary.read(life.run_dir) or {}
        fields: Dict[str, Any] = {} if done.get("metrics") else {"metrics": summary.numbers(value)}
        life.end(Outcome.COMPLETED, **fields)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2 (rank 0): requeue the same call; the app resumes from its checkpoint."""
        run = args[0] if args else kwargs["run"]
        run_dir = RunSpec.from_json(run, Path(self.sweep_dir)).run_dir
        if not requeue(run_dir):  # the record is final (completed, cancelled): never run it again
            summary.write(run_dir)
            raise SystemExit(0)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
