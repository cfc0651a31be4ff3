"""One base launcher (plan, validate, submit, return or wait); local and Slurm differ in a few hooks.

Login-node code: submitit and hpctrain's light modules only, never torch. The launcher works for any
Hydra app; hpctrain's own checks run only when the task function carries ``validate_job``.
"""

import logging
import os
import shlex
import sys
from inspect import signature
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hpctrain.core import events, manifest
from hpctrain.core import paths as runfiles
from hpctrain.core.run import RunSpec
from hpctrain.launch import provenance, snapshot
from hpctrain.launch.container import check_container, container_command, default_binds
from hpctrain.launch.plan import Run, exclude_constant_keys, plan_runs
from hpctrain.slurm import parse as slurm_parse

log = logging.getLogger(__name__)


class LaunchError(CompactHydraException):
    """Bad input found on the login node, or failed runs: Hydra prints the message alone, exits 1."""


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
        self.base = Path(".hpctrain", "submission-0")  # this launch's files, set in launch()
        self.hydra_context: Optional[HydraContext] = None
        self.code: Optional[snapshot.Snapshot] = None  # the code snapshot: planned in check(), taken once
        self.record_path: Optional[Path] = None  # this submission's record of what ran (provenance.py)
        self._task_name: Optional[str] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        # here, not in launch(): Hydra's sweeper creates the sweep dir between the two
        problems = _check_writable(Path(str(config.hydra.sweep.dir)).absolute())
        if ":" in os.getcwd():  # the snapshot's copy of it goes on PYTHONPATH, which ':' splits
            problems.append(f"the launch directory {os.getcwd()!r}: expected a path without ':' (it splits the "
                            f"job's PYTHONPATH); launch from a directory without it")
        if problems:
            raise LaunchError(f"nothing submitted: {problems[0]}")

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

    def submit(self, tasks: List[List[Run]], job: Any, python: str, sweep_dir: Path) -> List[Any]:
        """Submit one task per entry of ``tasks`` (one run each, or a pack); one submitit job per task."""
        raise NotImplementedError

    def check_queue(self, n_tasks: int) -> List[str]:
        """Problems with queueing ``n_tasks`` tasks (a cap on jobs in the queue); none by default."""
        return []

    def dry_run_text(self, tasks: List[List[Run]], python: str, sweep_dir: Path) -> str:
        return ""

    def finish(self, runs: List[Run], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        raise NotImplementedError

    # ------------------------------------------------------------------ the flow
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        exclude_constant_keys(self.config, job_overrides)
        validate = getattr(self.task_function, "validate_job", None)
        world_size = self.world_size()
        takes_plain = validate is not None and _takes(validate, "plain")

        def inspect(cfg: DictConfig, plain: Optional[Dict[str, Any]]) -> List[str]:
            if takes_plain and plain is not None:
                return validate(cfg, world_size=world_size, plain=plain)
            return validate(cfg, world_size=world_size)

        runs, problems = plan_runs(self.hydra_context, self.config, job_overrides, initial_job_idx,
                                   inspect if validate is not None else None)
        problems = self.check(runs, sweep_dir) + problems
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise LaunchError(f"nothing submitted: {len(problems)} problem(s):\n{lines}")

        app = events.app_fingerprint(self.task_function)
        completed = [events.is_completed(r.run_dir, app) for r in runs]  # a rerun finishes what is left
        done = [r for r, c in zip(runs, completed) if c]
        todo = [r for r, c in zip(runs, completed) if not c]
        k = self.runs_per_task()
        tasks = [todo[i:i + k] for i in range(0, len(todo), k)]  # ceil(N / k) tasks
        problems = self.check_queue(len(tasks)) if todo else []
        if problems:
            raise LaunchError(f"nothing submitted: {problems[0]}")
        for r in done:
            print(f"  skip {r.name}: already completed")
        python = self.python_command(sweep_dir)
        self.base = self.submission_base(sweep_dir)
        if self.params.dry_run:
            print(self.dry_run_text(tasks, python, sweep_dir))
            packed = f" as {len(tasks)} task(s)" if k > 1 else ""
            print(f"runs ({len(todo)} to submit{packed}, {len(done)} already completed):")
            for r in todo:
                print(f"  {r.idx:>4}  {r.run_dir}")
            self.say_snapshot(dry_run=True)
            print("dry run: nothing submitted")
            return [self._placeholder(r, JobStatus.COMPLETED) for r in runs]
        if not todo:
            print(f"all {len(runs)} runs of {sweep_dir} already completed: nothing to submit")
            return [self._placeholder(r, JobStatus.COMPLETED) for r in runs]

        from hpctrain.job.pack import PackJob
        from hpctrain.job.wrapper import SweepJob, save_payload

        payload = self.base.with_suffix(".pkl")
        context = self.take_snapshot(sweep_dir, [r.idx for r in todo], python)
        save_payload(payload, context, self.task_function, self.config)
        # per task: its run dir, or a packed task's list of run dirs (read by ended.py after each attempt)
        runfiles.write_json_atomic(payload.with_suffix(".runs.json"),
                                   [[str(r.run_dir) for r in t] if k > 1 else str(t[0].run_dir) for t in tasks])
        fraction = self.params.gpu_memory_fraction
        job = (PackJob(str(payload), str(sweep_dir), float(fraction) if fraction else None, app) if k > 1
               else SweepJob(str(payload), str(sweep_dir), app))
        self.record_submission(sweep_dir, todo)
        task_jobs = self.submit(tasks, job, python, sweep_dir)
        jobs = [j for t, j in zip(tasks, task_jobs) for _ in t]  # one per run: packed runs share their task's
        self.record_job_ids(sweep_dir, {r.idx: str(j.job_id) for r, j in zip(todo, jobs)})
        if self.record_path is not None:
            provenance.add_job_ids(self.record_path, [str(j.job_id) for j in jobs])
        return self.finish(todo, jobs, sweep_dir)

    def runs_per_task(self) -> int:
        return max(1, int(self.params.get("runs_per_task") or 1))

    @staticmethod
    def task_args(tasks: List[List[Run]], packed: bool) -> List[List[Any]]:
        """submitit ``map_array`` arguments, one list per parameter: (idx, overrides, run_dir) per task, or
        one list of such points per packed task."""
        if packed:
            return [[[(r.idx, r.overrides, str(r.run_dir)) for r in t] for t in tasks]]
        return [[t[0].idx for t in tasks], [t[0].overrides for t in tasks], [str(t[0].run_dir) for t in tasks]]

    def check(self, runs: List[Run], sweep_dir: Path) -> List[str]:
        """Every problem of the launcher settings at once (each sweep point's config is checked by plan_runs,
        with the app's ``validate_job``, while its config is at hand)."""
        problems = self.check_resources()
        c = self.params.container
        problems += check_container(c.image, c.runtime, list(c.binds))
        for name in self.params.env:
            if runfiles.looks_secret(name):
                problems.append(
                    f"hydra.launcher.env.{name}: looks like a secret; it would be written to the job script. "
                    f"Export it in your shell instead (Slurm passes your environment to the job)"
                )
        for key in ("max_retries", "max_num_timeout", "signal_delay_s"):
            if int(self.params[key]) < 0:
                problems.append(f"hydra.launcher.{key}={self.params[key]}: expected an integer >= 0")
        problems += self.check_packing()
        if int(self.params.timeout_min) <= 0:
            problems.append(f"hydra.launcher.timeout_min={self.params.timeout_min}: expected an integer > 0")
        problems += self.plan_snapshot(sweep_dir)
        if getattr(self.task_function, "validate_job", None) is not None:
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

    @staticmethod
    def submission_base(sweep_dir: Path) -> Path:
        """``<sweep>/.hpctrain/submission-N``: this launch's payload (.pkl) and run list (.runs.json)."""
        n = len(list((sweep_dir / ".hpctrain").glob("submission-*.pkl")))
        return sweep_dir / ".hpctrain" / f"submission-{n}"

    def setup_lines(self) -> List[str]:
        lines = [f"export {name}={shlex.quote(str(value))}" for name, value in self.params.env.items()]
        return lines + list(self.params.setup) + self.snapshot_lines()

    # ------------------------------------------------------------------ the code snapshot (hpctrain/launch/snapshot.py)
    def plan_snapshot(self, sweep_dir: Path) -> List[str]:
        """What the snapshot would copy, and its problems; planned once per process (one per sweep)."""
        settings, problems = snapshot.read_settings(self.params.snapshot)
        if settings is not None and self.code is None:
            code_dir = self.submission_base(sweep_dir) / "code"
            self.code = snapshot.plan(settings, _cwd(), code_dir, exclude=[sweep_dir])
        return problems + (self.code.problems if self.code else [])

    def snapshot_lines(self) -> List[str]:
        """The job script's lines that make its Python import the snapshot first."""
        if self.code is None:
            return []
        c = self.params.container
        return snapshot.setup_lines(self.code.python_path(_cwd()), c.runtime if c.image else None)

    def say_snapshot(self, dry_run: bool = False, seconds: float = 0.0) -> None:
        """On stderr, as notes: stdout keeps the dry run's script and run list as they were."""
        if self.code is None:
            print("hpctrain: no code snapshot (hydra.launcher.snapshot=false): tasks import the live tree",
                  file=sys.stderr)
            return
        for note in self.code.notes:
            print(f"hpctrain: {note}", file=sys.stderr)
        size = sum(self.code.files.values()) / 2**20
        done = "would copy" if dry_run else f"copied in {seconds:.2f} s"
        print(f"hpctrain: code snapshot: {len(self.code.files)} files, {size:.1f} MB, {done} to {self.code.code_dir}",
              file=sys.stderr)

    def take_snapshot(self, sweep_dir: Path, runs: List[int], python: str) -> HydraContext:
        """Copy the code (once per process) and record what runs; the Hydra context the job composes with."""
        assert self.hydra_context is not None
        if self.code is not None and not self.code.taken:
            try:
                self.say_snapshot(seconds=self.code.take())
            except OSError as exc:
                raise LaunchError(f"nothing submitted: cannot write the code snapshot {self.code.code_dir}: {exc}")
        elif self.code is None:
            self.say_snapshot()
        c = self.params.container
        repos = self.code.repos if self.code else snapshot.source_repos(_cwd())
        self.record_path = provenance.write(
            self.base, sweep_dir, runs=runs, repos=repos, code_dir=self.code.code_dir if self.code else None,
            python_path=self.code.python_path(_cwd()) if self.code else None, job_python=python, image=c.image)
        return snapshot.relocate_search_path(self.hydra_context, self.code) if self.code else self.hydra_context

    def record_submission(self, sweep_dir: Path, runs: List[Run]) -> None:
        """Before anything starts: this submission's runs in sweep.json and in their event logs."""
        app = getattr(self.task_function, "__module__", None)
        if app == "__main__":  # a script run as `python train.py`: the script is the app
            app = os.path.abspath(sys.argv[0])
        for run in runs:
            events.submitted(run.run_dir)  # retries count from here

        def add(m: manifest.Manifest) -> None:
            m.launcher, m.app, m.submitit_folder, m.launcher_pid = (
                self.kind, app, str(self.params.submitit_folder), os.getpid())
            m.submissions.append(manifest.Submission(runs=[r.idx for r in runs], launcher_pid=os.getpid()))
            for run in runs:
                spec = RunSpec(run.idx, tuple(run.overrides), Path(run.run_dir).absolute(), run.max_steps)
                m.runs[run.idx] = manifest.RunEntry(spec)  # job_id: filled in once the job exists

        manifest.update(sweep_dir, add)

    def record_job_ids(self, sweep_dir: Path, job_ids: Dict[int, str]) -> None:
        def add(m: manifest.Manifest) -> None:
            submission = m.last_submission()
            submission.job_ids = sorted(set(submission.job_ids) | set(slurm_parse.array_ids(job_ids.values())))
            for idx, job_id in job_ids.items():
                m.runs[idx].job_id = job_id

        manifest.update(sweep_dir, add)

    def report_results(self, runs: List[Run], returns: List[JobReturn], sweep_dir: Path) -> List[JobReturn]:
        """One line per ended run, the counts, and a non-zero exit (LaunchError) when a run failed."""
        print(f"sweep {sweep_dir}:")
        print("\n".join(summary_lines(runs)))
        failed = sum(r.status == JobStatus.FAILED for r in returns)
        print(f"{len(runs) - failed} completed, {failed} failed.  Next: python -m hpctrain report {sweep_dir}")
        if failed:
            raise LaunchError(f"{failed} of {len(runs)} run(s) failed: their metrics.json hold the errors")
        return returns

    def _collect(self, run: Run, job: Any) -> JobReturn:
        """Rank 0's JobReturn as Hydra's ``run_job`` made it (cfg, hydra_cfg, task_name, working_dir, the
        return value), or the job's exception as a failed JobReturn."""
        if self.runs_per_task() > 1:  # a packed task returns no JobReturn per run: its record says
            status = JobStatus.COMPLETED if events.is_completed(run.run_dir) else JobStatus.FAILED
            ret = self._placeholder(run, status)
            summary = runfiles.read_metrics(run.run_dir) or {}
            ret.return_value = summary.get("metrics") if status == JobStatus.COMPLETED else RuntimeError(
                str(summary.get("error") or f"run {run.idx} ended {events.state_of(run.run_dir)}"))
            return ret
        try:
            ret = job.results()[0]
        except Exception as exc:  # noqa: BLE001 - a failed run is reported, the sweep goes on
            ret = self._placeholder(run, JobStatus.FAILED)
            ret.return_value = exc
            return ret
        if not isinstance(ret, JobReturn):  # a job of an older payload returned the bare value
            value, ret = ret, self._placeholder(run, JobStatus.COMPLETED)
            ret.return_value = value
        return ret

    def _placeholder(self, run: Run, status: JobStatus) -> JobReturn:
        """A JobReturn for a run whose job gave none (skipped, dry run, not waited for, died)."""
        if self._task_name is None and self.config is not None:
            self._task_name = str(self.config.hydra.job.name)  # read once: 10,000 placeholders in a sweep
        ret = _PlanReturn(overrides=run.overrides, status=status, task_name=self._task_name)
        ret.run = run
        ret.working_dir = str(run.run_dir)
        return ret


def _cwd() -> Path:
    return Path(os.path.realpath(os.getcwd()))


class _PlanReturn(JobReturn):
    """A JobReturn whose ``cfg`` (the point's config) is built only when read: 10,000 placeholders of an
    unwaited sweep would otherwise cost a config copy each."""

    run: Optional[Run] = None

    @property  # type: ignore[override]
    def cfg(self) -> Optional[DictConfig]:
        return self.run.cfg if self.run is not None else None

    @cfg.setter
    def cfg(self, value: Optional[DictConfig]) -> None:
        pass  # always the run's own


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


def summary_lines(runs: List[Run]) -> List[str]:
    """One line per run: its values, state, final loss (or the first metric a foreign app returned), where
    its TensorBoard logs are."""
    lines = []
    for run in runs:
        metrics = (runfiles.read_metrics(run.run_dir) or {}).get("metrics") or {}
        name = "train/loss" if "train/loss" in metrics else next(iter(metrics), "loss")
        value = metrics.get(name)
        shown = f"{value:.4g}" if isinstance(value, (int, float)) else "-"
        values = " ".join(filter_overrides(run.overrides)) or "(defaults)"
        state = events.state_of(run.run_dir) or "unknown"
        lines.append(f"  #{run.idx:<3} {values:<30} {state:<10} {name.split('/')[-1]}={shown:<8} "
                     f"tb={run.run_dir / runfiles.TB_DIR}")
    return lines


def _takes(function: Any, name: str) -> bool:
    """Whether ``function`` has a parameter ``name`` (False where its signature cannot be read)."""
    try:
        return name in signature(function).parameters
    except (TypeError, ValueError):
        return False
