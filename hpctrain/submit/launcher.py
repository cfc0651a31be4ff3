"""The Hydra launcher: plan -> checks -> code snapshot -> submission -> backend; local and Slurm are
backends that differ in a few hooks (:mod:`hpctrain.submit.backends`).

Login-node code: submitit and hpctrain's light modules only, never torch. The launcher works for any
Hydra app; hpctrain's own checks run only where the task function's contract has them (core/app_contract.py).

Its public steps, which the search sweeper uses too: :meth:`BaseLauncher.name_runs_by` (run-dir names
decided over the whole sweep), :meth:`~BaseLauncher.describe` (the :class:`Submission` object),
:meth:`~BaseLauncher.stage` (snapshot, record, payload and run list written), :meth:`~BaseLauncher.send`.
"""

import json
import logging
import os
import shlex
import sys
from inspect import signature
from pathlib import Path
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hpctrain.core import events, liveness, manifest, redact
from hpctrain.core.liveness import Liveness
from hpctrain.core.atomic import write_text_atomic
from hpctrain.core.app_contract import contract_of
from hpctrain.core.run import RunSpec
from hpctrain.submit import provenance, rerun, results, snapshot
from hpctrain.submit.checks import script_field_problems
from hpctrain.submit.code import CodeStage
from hpctrain.submit.container import check_args, check_container, container_command, default_binds
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.keys import swept_problems
from hpctrain.submit.lock import one_submission
from hpctrain.submit.plan import PlannedRun, constant_keys, exclude_from_names, job_id_note, plan_runs
from hpctrain.submit.results import Returns, print_next_commands
from hpctrain.submit.submission import Array, Calling, Files, Submission, tasks_of
from hpctrain.slurm import parse as slurm_parse

__all__ = ["BaseLauncher", "LaunchError", "PlannedRun", "implementation_of"]

log = logging.getLogger(__name__)

JobIds = Callable[[Dict[int, str]], None]  # told the job ids as they come: run (or worker) index -> job id


def implementation_of(launcher: Any) -> "Optional[BaseLauncher]":
    """hpctrain's launcher behind the plugin's shell (``hydra/launcher=local|slurm``), or None for another."""
    impl = getattr(launcher, "impl", launcher)
    return impl if isinstance(impl, BaseLauncher) else None


class BaseLauncher(Launcher):
    kind = "base"

    def __init__(self, **params: Any) -> None:
        self.params: DictConfig = OmegaConf.create(params)
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self.code = CodeStage(self.params.snapshot, self.params.container)  # planned in check(), taken once
        self.record_path: Optional[Path] = None  # this submission's record of what ran (provenance.py)
        self.names_decided = False  # constant keys left out of run-dir names: decided once per sweep
        self.noted = False  # the plan_N note (hydra.job.id in hydra.sweep.subdir) said once per sweep
        self._returns: Optional[Returns] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.code.app = snapshot.app_dir(task_function)  # the app's own code: snapshot and record it
        # here, not in launch(): Hydra's sweeper creates the sweep dir between the two
        # before Hydra's sweeper writes multirun.yaml: a setting refused here is written nowhere
        problems = script_field_problems(OmegaConf.to_container(self.params, resolve=True),  # type: ignore[arg-type]
                                         {"hydra.sweep.dir": str(config.hydra.sweep.dir), "the launch directory": os.getcwd()})
        problems = problems or _check_writable(Path(str(config.hydra.sweep.dir)).absolute())
        if ":" in os.getcwd():  # the snapshot's copy of it goes on PYTHONPATH, which ':' splits
            problems.append(f"the launch directory {os.getcwd()!r}: expected a path without ':' (it splits the "
                            f"job's PYTHONPATH); launch from a directory without it")
        if problems:
            raise LaunchError("nothing submitted: " + (problems[0] if len(problems) == 1 else
                              f"{len(problems)} problem(s):\n" + "\n".join(f"  {p}" for p in problems)))

    # ------------------------------------------------------------------ hooks
    def gpus_per_node(self) -> int:
        return int(self.params.gpus_per_node or 0)

    def requests_gpus(self) -> bool:
        """Whether the job is given GPUs (the container then needs --nv)."""
        return self.gpus_per_node() > 0

    def tasks_per_node(self) -> int:
        return int(self.params.tasks_per_node or self.gpus_per_node() or 1)

    def world_size(self) -> int:
        return self.tasks_per_node()

    def check_resources(self) -> List[str]:
        return []

    def most_workers(self) -> Optional["tuple[int, str]"]:
        """The most pull workers one submission may have (they must all be able to start: one array), and
        why; None: no such limit."""
        return None

    def queue_room(self, n_tasks: int) -> Optional["tuple[int, str]"]:
        """None when ``n_tasks`` tasks fit in the queue; else how many do (the cap less what is queued)
        and the cap, said in words with its numbers. No cap by default."""
        return None

    def plan_arrays(self, submission: Submission) -> List[Array]:
        """How the backend cuts the submission's tasks, each part's executor parameters and script."""
        raise NotImplementedError

    def send(self, submission: Submission, job: Any, job_ids: JobIds) -> List[Any]:
        """Submit ``submission`` (one submitit job per task, ``job`` the callable); ``job_ids`` is told each
        run's job id once it exists. The submitit jobs, one per task, in order."""
        raise NotImplementedError

    def finish(self, runs: List[PlannedRun], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        raise NotImplementedError

    def resources(self) -> Dict[str, Any]:
        """What each task is given, as the submission describes it."""
        return {"nodes": 1, "tasks_per_node": self.tasks_per_node(), "gpus_per_node": self.gpus_per_node(),
                "runs_per_task": self.runs_per_task(), "timeout_min": int(self.params.timeout_min)}

    # ------------------------------------------------------------------ the public steps
    def name_runs_by(self, job_overrides: Sequence[Sequence[str]]) -> None:
        """Leave out of run-dir names the keys constant over ``job_overrides``, all the sweep's points (a
        sweeper that launches in batches calls this first); once: later calls change nothing."""
        assert self.config is not None
        if not self.names_decided:
            exclude_from_names(self.config, constant_keys(job_overrides) + redact.secret_keys(job_overrides))
            self.names_decided = True

    def describe(self, runs: Sequence[RunSpec], sweep_dir: Path, *, calling: Optional[Calling] = None,
                 skipped: Sequence[RunSpec] = ()) -> Submission:
        """The submission of ``runs``: tasks, arrays with their scripts, files, resources. Writes nothing."""
        packed = self.runs_per_task() > 1
        calling = calling or (Calling.PACK if packed else Calling.RUN)
        files = Files.next_in(sweep_dir)
        self.code.place(files)  # the number is taken now (under the submission lock), not when planned
        submission = Submission(
            kind=self.kind, sweep_dir=sweep_dir, files=files, python=self.python_command(sweep_dir),
            calling=calling, tasks=tasks_of(list(runs), self.runs_per_task() if calling == Calling.PACK else 1),
            resources=self.resources(), skipped=list(skipped),
            executor={"folder": str(self.params.submitit_folder), "max_num_timeout": int(self.params.max_num_timeout)})
        submission.arrays = self.plan_arrays(submission)
        return submission

    def stage(self, submission: Submission) -> None:
        """Before ``send``: the code copied (once per process), what runs recorded, the payload (Hydra
        context, task function, config: pickled once) and the run list written."""
        from hpctrain.job.wrapper import save_payload

        assert self.task_function is not None and self.config is not None
        context = self.take_snapshot(submission)
        try:
            save_payload(submission.files.payload, context, self.task_function, self.config)
        except Exception as exc:  # cloudpickle fails with TypeError, PicklingError, AttributeError...
            raise LaunchError(f"nothing submitted: the job cannot be pickled (task function "
                              f"{getattr(self.task_function, '__qualname__', self.task_function)}, its globals "
                              f"or the config): {type(exc).__name__}: {exc}") from exc
        # the C encoder (no indent): the job script reads this list; Python's indenting encoder took ~0.1 ms a run
        write_text_atomic(submission.files.runs, json.dumps(submission.runs_json(), sort_keys=True, default=str))

    # ------------------------------------------------------------------ the flow
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        if not self.names_decided:  # a sweeper that did not say the whole sweep: this launch is all of it
            exclude_from_names(self.config, constant_keys(job_overrides) + redact.secret_keys(job_overrides))
        # the user's own app (its code in the snapshot): run dirs named by values; an installed one keeps Hydra's
        runs, problems = plan_runs(self.hydra_context, self.config, job_overrides, initial_job_idx, self._inspect(),
                                   by_values=self.code.app is not None)
        if problems:  # a swept key or value no point takes: one line for it, not one per point
            problems = swept_problems(self.hydra_context.config_loader, self.config, job_overrides) or problems
        problems = self.check(runs, sweep_dir) + problems
        if len(problems) == 1:
            raise LaunchError(f"nothing submitted: {problems[0]}")
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise LaunchError(f"nothing submitted: {len(problems)} problem(s):\n{lines}")
        note = job_id_note(self.config)
        if note and not self.noted:  # once per sweep, however many batches it is launched in
            print(f"hpctrain: note: {note}", file=sys.stderr)
            self.noted = True
        # from what is left to submit and the submission's number to its job ids recorded (lock.py)
        with nullcontext() if self.params.dry_run else one_submission(sweep_dir):
            return self._submit(runs, sweep_dir)

    def _submit(self, runs: List[PlannedRun], sweep_dir: Path) -> Sequence[JobReturn]:
        assert self.task_function is not None
        if not self.params.dry_run:
            self.cancel_orphans(sweep_dir)  # before the queue is asked what is left to run
        app = events.app_fingerprint(self.task_function)
        if self.code.copy is not None:  # the user's own modules are the same code too
            app = rerun.fingerprint(app, self.code.copy.files)
        left = rerun.sort(runs, app, sweep_dir, self.in_queue)  # a rerun finishes what is left, once
        todo, done = left.todo, left.completed
        workers = self.pull_workers(len(todo)) if todo else None
        if workers is not None:
            submission = self.describe_pull([r.spec for r in todo], sweep_dir, workers, [r.spec for r in done])
        else:
            submission = self.describe([r.spec for r in todo], sweep_dir, skipped=[r.spec for r in done])
        for line in left.lines():
            print(line)
        returns = self.returns()
        if self.params.dry_run:
            print(submission.render())
            self.code.say(dry_run=True)
            print("dry run: nothing submitted")
            return [returns.placeholder(r, JobStatus.COMPLETED) for r in runs]
        if not todo:
            if len(done) == len(runs):
                print(f"all {len(runs)} runs of {sweep_dir} already completed: nothing to submit")
            else:
                print(f"nothing to submit in {sweep_dir}: {len(done)} run(s) completed, "
                      f"{len(runs) - len(done)} queued or running")
            return [returns.placeholder(r, JobStatus.COMPLETED) for r in runs]

        try:
            self.stage(submission)
        except BaseException:
            self.discard(submission)  # nothing was submitted with them: the number stays free of debris
            raise
        for run in left.stale:
            aside = rerun.set_aside(run)
            print(f"  rerun {run.name} from scratch: completed by other code"
                  + (f"; its checkpoints kept in {aside}" if aside else ""))
        self.record_submission(sweep_dir, todo, workers)
        if workers is not None:
            points = [r.idx for r in todo]
            task_jobs = self.send(submission, self.job_for(submission, app),
                                  lambda ids: self.record_workers(sweep_dir, list(ids.values()), points))
            return self.finish_pulled(todo, task_jobs, sweep_dir)
        task_jobs = self.send(submission, self.job_for(submission, app),
                              lambda ids: self.record_job_ids(sweep_dir, ids))
        jobs = [j for t, j in zip(submission.tasks, task_jobs) for _ in t]  # one per run: packed runs share
        return self.finish(todo, jobs, sweep_dir)

    # ------------------------------------------------------------------ pull workers (search/pull.py)
    def pull_workers(self, n_runs: int) -> Optional[int]:
        """How many workers pull the runs: ``hydra.launcher.workers`` when set, else, when the runs' tasks
        would not fit under the queue's cap, as many as do (said in one line); None: one task per run (or pack).
        Raises when not even the workers fit."""
        asked = self.params.get("workers")
        n_tasks = -(-n_runs // self.runs_per_task())
        if asked is None:
            room = self.queue_room(n_tasks)
            if room is None:
                return None
            most, cap = room
            if most < 1 or self.world_size() > 1 or self.runs_per_task() > 1:
                why = "" if most < 1 else (": pull workers run single-rank, unpacked runs; split the sweep")
                raise LaunchError(f"nothing submitted: the sweep needs {n_tasks} jobs in the queue (array tasks) "
                                  f"and {cap}{why}")
            limit = self.most_workers()
            workers = min(most, n_runs, limit[0] if limit is not None else most)
            print(f"hpctrain: {n_runs} runs would be {n_tasks} jobs in the queue and {cap}: {workers} workers pull "
                  f"the runs instead (hydra.launcher.workers={workers})")
            return workers
        workers = min(int(asked), n_runs)
        limit = self.most_workers()
        if workers < 1 or (limit is not None and workers > limit[0]):
            raise LaunchError(f"nothing submitted: hydra.launcher.workers={asked}: expected an integer from 1 to "
                              f"{limit[0] if limit is not None else 'the number of runs'}"
                              + (f" ({limit[1]})" if limit is not None else ""))
        room = self.queue_room(workers)
        if room is not None:
            raise LaunchError(f"nothing submitted: hydra.launcher.workers={asked}: {workers} jobs in the queue and "
                              f"{room[1]}")
        return workers

    def describe_pull(self, runs: Sequence[RunSpec], sweep_dir: Path, workers: int,
                      skipped: Sequence[RunSpec] = ()) -> Submission:
        """The submission of ``runs`` pulled by ``workers`` tasks: the tasks are the workers (placeholder run
        dirs, as a search's), the runs its points. Writes nothing."""
        from hpctrain.core.paths import SweepPaths
        from hpctrain.submit.plan import make_spec

        files = Files.next_in(sweep_dir)
        self.code.place(files)
        tasks = tasks_of([make_spec(i, [], SweepPaths(sweep_dir).worker_placeholder(i)) for i in range(workers)], 1)
        submission = Submission(
            kind=self.kind, sweep_dir=sweep_dir, files=files, python=self.python_command(sweep_dir),
            calling=Calling.PULL, tasks=tasks, resources=dict(self.resources(), workers=workers),
            skipped=list(skipped), points=list(runs),
            executor={"folder": str(self.params.submitit_folder), "max_num_timeout": int(self.params.max_num_timeout)})
        submission.arrays = self.plan_arrays(submission)
        return submission

    def record_workers(self, sweep_dir: Path, job_ids: List[str], points: List[int]) -> None:
        """The workers' job ids, with their submission; each point's job: the workers' array (Slurm), the
        worker that runs it being in its record."""
        arrays = slurm_parse.array_ids(job_ids)

        def add(data: Dict[str, Any]) -> Dict[str, Any]:  # the raw JSON: no typed view of every run
            last = data["submissions"][-1]
            workers = sorted(set(last.get("worker_job_ids") or []) | set(job_ids), key=slurm_parse.job_order)
            last["worker_job_ids"] = workers
            last["job_ids"] = slurm_parse.array_ids(workers)
            runs = data.get("runs") or {}
            for idx in points if self.kind == "slurm" and arrays else ():
                runs[str(idx)]["job_id"] = arrays[0]
            return data

        manifest.update_json(sweep_dir, add)
        if self.record_path is not None:
            provenance.add_job_ids(self.record_path, job_ids)

    def finish_pulled(self, runs: List[PlannedRun], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        """After the workers were sent: what ``finish`` says of a sweep; each run's return from its record."""
        ids = slurm_parse.array_ids(str(j.job_id) for j in jobs)
        if self.kind == "slurm":
            print(f"hpctrain: submitted {len(runs)} run(s) as Slurm job {', '.join(ids)} ({len(jobs)} workers pulling "
                  f"the runs)")
            print_next_commands(sweep_dir)
            if not self.params.get("wait"):
                return [self.returns().placeholder(r, JobStatus.COMPLETED) for r in runs]
            from hpctrain.slurm import query as slurm

            job_ids = [str(j.job_id) for j in jobs]
            slurm.poll_squeue(job_ids, 10.0, lambda q: not any(slurm_parse.in_queue(q, i) for i in job_ids),
                              lambda q: None)
        collect = Returns(self.returns().task_name, True)  # the records say how each point ended
        return results.report(runs, [collect.collect(r, None) for r in runs], sweep_dir)

    def cancel_orphans(self, sweep_dir: Path) -> None:
        """Jobs an earlier, interrupted command of this sweep queued and never recorded (Slurm's only)."""

    def in_queue(self, job_ids: List[str]) -> Optional[Set[str]]:
        """Which of ``job_ids`` are still queued or running (None: unknown). Local: the live controllers."""
        states = {j: liveness.process(j, needle="submitit") for j in job_ids}  # submitit's local job id: its pid
        if Liveness.UNKNOWN in states.values():
            return None  # a process that cannot be asked about: unknown, never gone
        return {j for j, state in states.items() if state is Liveness.ALIVE}

    def discard(self, submission: Submission) -> None:
        """Undo a submission that failed before anything was sent: its files, and the copy taken into them."""
        submission.files.remove()
        if self.code.copy is not None and submission.files.base in self.code.copy.code_dir.parents:
            self.code.copy.taken = False
        self.record_path = None

    def _inspect(self) -> Any:
        """The app's own check of each point (its contract's ``validate``), as plan_runs calls it; None for other apps."""
        validate = contract_of(self.task_function).validate
        if validate is None:
            return None
        world_size = self.world_size()
        takes_plain = _takes(validate, "plain")

        def inspect(cfg: DictConfig, plain: Optional[Dict[str, Any]]) -> List[str]:
            if takes_plain and plain is not None:
                return validate(cfg, world_size=world_size, plain=plain)
            return validate(cfg, world_size=world_size)

        return inspect

    def job_for(self, submission: Submission, app: str) -> Any:
        """The callable each task runs: one run, or a pack of runs side by side."""
        from hpctrain.job.pack import PackJob
        from hpctrain.job.wrapper import SweepJob

        payload, sweep_dir = str(submission.files.payload), str(submission.sweep_dir)
        if submission.calling == Calling.PULL:
            from hpctrain.search.points import PullSettings
            from hpctrain.search.pull import PullJob

            retries = int(self.params.max_retries)
            settings = PullSettings(max_adoptions=retries + 1, max_retries=retries)
            return PullJob(payload, sweep_dir, app, str(submission.files.runs), str(submission.claims_dir),
                           len(submission.tasks), settings)
        if submission.calling == Calling.PACK:
            fraction = self.params.gpu_memory_fraction
            return PackJob(payload, sweep_dir, float(fraction) if fraction else None, app,
                           float(self.params.signal_delay_s))
        return SweepJob(payload, sweep_dir, app)

    def returns(self) -> Returns:
        if self._returns is None:
            name = str(self.config.hydra.job.name) if self.config is not None else None
            self._returns = Returns(name, self.runs_per_task() > 1)
        return self._returns

    def runs_per_task(self) -> int:
        return max(1, int(self.params.get("runs_per_task") or 1))

    def check(self, runs: List[PlannedRun], sweep_dir: Path) -> List[str]:
        """Every problem of the launcher settings at once (each sweep point's config is checked by plan_runs,
        with the app's ``validate``, while its config is at hand)."""
        problems = self.check_resources()
        c = self.params.container
        problems += check_container(c.image, c.runtime, list(c.binds))
        problems += check_args(list(c.args)) if c.image else []
        for key in ("max_retries", "max_num_timeout", "signal_delay_s"):
            if int(self.params[key]) < 0:
                problems.append(f"hydra.launcher.{key}={self.params[key]}: expected an integer >= 0")
        problems += self.check_packing()
        if int(self.params.timeout_min) <= 0:
            problems.append(f"hydra.launcher.timeout_min={self.params.timeout_min}: expected an integer > 0")
        problems += self.plan_snapshot(sweep_dir)
        contract = contract_of(self.task_function)
        if contract.unread_keys is not None and runs:  # an added key is the same in every point: said once
            for warning in contract.unread_keys(runs[0].cfg):
                print(f"hpctrain: warning: {warning}", file=sys.stderr)
        if contract.gpu_per_rank:
            gpus, tasks = self.gpus_per_node(), self.tasks_per_node()
            if 0 < gpus < tasks:  # hpctrain's ranks take one GPU each
                problems.append(f"hydra.launcher.tasks_per_node={tasks}: more than gpus_per_node={gpus}; "
                                f"ranks would share a GPU (NCCL refuses that)")
        return problems

    def check_packing(self) -> List[str]:
        k = self.params.get("runs_per_task", 1)
        if k is None or int(k) < 1:
            return [f"hydra.launcher.runs_per_task={k}: expected an integer >= 1"]
        problems = []
        if int(k) > 1 and self.world_size() > 1:
            problems.append(f"hydra.launcher.runs_per_task={k}: only single-rank runs can be packed; these runs have "
                            f"{self.world_size()} ranks (nodes x tasks_per_node); use runs_per_task=1")
        fraction = self.params.get("gpu_memory_fraction")
        if fraction is not None and not 0 < float(fraction) <= 1:
            problems.append(f"hydra.launcher.gpu_memory_fraction={fraction}: expected a number in (0, 1]")
        return problems

    def python_command(self, sweep_dir: Path) -> str:
        c = self.params.container
        if not c.image:
            return self.params.python or shlex.quote(sys.executable)
        binds = default_binds(sweep_dir, Path.cwd(), Path(str(self.params.submitit_folder))) + list(c.binds)
        return container_command(str(Path(c.image).absolute()), c.runtime, self.requests_gpus(), binds,
                                 list(c.args), c.python)

    def setup_lines(self) -> List[str]:
        lines = [f"export {name}={shlex.quote(str(value))}" for name, value in self.params.env.items()]
        return lines + list(self.params.setup) + self.snapshot_lines()

    # ------------------------------------------------------------------ the code snapshot (hpctrain/submit/code.py)
    def plan_snapshot(self, sweep_dir: Path) -> List[str]:
        """What the snapshot would copy, and its problems; planned once per process (one per sweep)."""
        return self.code.plan(sweep_dir)

    def snapshot_lines(self) -> List[str]:
        return self.code.lines()

    def take_snapshot(self, submission: Submission) -> HydraContext:
        """Copy the code (once per process) and record what runs; the Hydra context the job composes with."""
        assert self.hydra_context is not None
        context, self.record_path = self.code.take(submission, self.hydra_context)
        return context

    # ------------------------------------------------------------------ sweep.json (the manifest)
    def record_submission(self, sweep_dir: Path, runs: List[PlannedRun], workers: Optional[int] = None) -> None:
        """Before anything starts: this submission's runs in sweep.json and in their event logs."""
        app = getattr(self.task_function, "__module__", None)
        if app == "__main__":  # a script run as `python train.py`: the script is the app
            app = os.path.abspath(sys.argv[0])
        events.submitted_all(run.run_dir for run in runs)  # retries count from here

        def add(m: manifest.Manifest) -> None:
            m.launcher, m.app, m.submitit_folder, m.launcher_pid = (
                self.kind, app, str(self.params.submitit_folder), os.getpid())
            m.submissions.append(manifest.SubmissionRecord(runs=[r.idx for r in runs], launcher_pid=os.getpid(),
                                                           extra={"workers": workers} if workers else {}))
            for run in runs:
                spec = RunSpec(run.idx, tuple(run.overrides), Path(run.run_dir).absolute(), run.max_steps)
                m.runs[run.idx] = manifest.RunEntry(spec)  # job_id: filled in once the job exists

        manifest.update(sweep_dir, add)

    def record_job_ids(self, sweep_dir: Path, job_ids: Dict[int, str]) -> None:
        manifest.add_job_ids(sweep_dir, job_ids, slurm_parse.array_ids(job_ids.values()))
        if self.record_path is not None:
            provenance.add_job_ids(self.record_path, list(job_ids.values()))


def _check_writable(sweep_dir: Path) -> List[str]:
    if ":" in str(sweep_dir):  # it would split the job's PYTHONPATH and Apptainer's --bind SRC:DST:OPTS
        return [f"hydra.sweep.dir={str(sweep_dir)!r}: expected a path without ':' (it splits PYTHONPATH and "
                f"the container's --bind list)"]
    parent = sweep_dir
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return [f"hydra.sweep.dir={str(sweep_dir)!r}: cannot be written ({parent} is not a writable directory)"]
    return []


def _takes(function: Any, name: str) -> bool:
    """Whether ``function`` has a parameter ``name`` (False where its signature cannot be read)."""
    try:
        return name in signature(function).parameters
    except (TypeError, ValueError):
        return False
