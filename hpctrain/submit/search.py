"""``hydra/sweeper=search``: an Optuna study worked through by the job array itself.

The login node checks the space and the settings (one line per problem, nothing submitted), opens
the study in the sweep dir (Optuna's journal file) and submits ``n_workers`` worker tasks through
hpctrain's launcher (its resources, container and ranks; one Slurm job array), then returns. Each
worker pulls trials until the study has ``n_trials`` (:mod:`hpctrain.search.worker`). Running the
same command again continues the study up to ``n_trials`` in total.

Its settings are :class:`hpctrain.search.settings.SearchSweeperConf`; optuna is imported in :meth:`SearchSweeper.sweep` only.
"""

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Collection, Dict, List, Optional

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hpctrain.core import events, manifest
from hpctrain.core.app_contract import contract_of
from hpctrain.core.paths import SweepPaths
from hpctrain.core.state import Direction, State
from hpctrain.core.run import RunSpec
from hpctrain.submit.backends.local import LocalLauncher
from hpctrain.submit.checks import scheduler_problems, uses_trial_api
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.lock import one_submission
from hpctrain.submit.launcher import BaseLauncher, implementation_of
from hpctrain.submit.plan import PlannedRun, make_spec, plan_runs
from hpctrain.submit.progress import Progress, trials_of
from hpctrain.submit.results import print_next_commands
from hpctrain.submit.submission import Calling
from hpctrain.search.settings import SearchSweeperConf, Settings
from hpctrain.search.space import Space, check, parse

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")  # as hpctrain.search.study.SAMPLERS (no optuna import here)
PRUNERS = ("median", "asha", "none")
SAMPLER_NEEDS = {"cmaes": ("cmaes",), "gp": ("scipy", "torch")}


class SearchSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        self.conf = OmegaConf.create(conf)
        self.config: Optional[DictConfig] = None
        self.launcher: Any = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    # ------------------------------------------------------------------ the login node's part
    def sweep(self, arguments: List[str]) -> Any:
        assert self.config is not None and self.hydra_context is not None
        launcher = implementation_of(self.launcher)
        if launcher is None:
            raise LaunchError("nothing submitted: hydra/sweeper=search needs one of hpctrain's launchers "
                              "(hydra/launcher=local or hydra/launcher=slurm)")
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        conf = self._typed_conf()  # read once: the worker's settings are built from it below
        space, problems = parse(arguments, conf.params)
        problems = self._check_settings() + problems
        if not problems:
            problems += check(space, str(self.conf.sampler))
        sample: Optional[PlannedRun] = None
        if not problems:
            sample, more = self._check_app(space, sweep_dir)
            problems += more
        metric, direction = self._objective(sample)
        eval_every = OmegaConf.select(sample.cfg, "eval_every", default=None) if sample is not None else None
        max_steps = OmegaConf.select(sample.cfg, "max_steps", default=None) if sample is not None else None
        if sample is not None:
            problems += scheduler_problems(self.conf, max_steps, eval_every, uses_trial_api(self.task_function),
                                           getattr(self.task_function, "__module__", None) or "the app")
            if self.conf.scheduler == "pbt" and not problems:
                problems += _pbt_problems(space, contract_of(self.task_function).mutable_keys)
        settings = Settings.from_conf(conf, space, metric=metric, direction=direction,
                                      n_workers=self._n_workers(launcher),
                                      max_retries=int(launcher.params.max_retries), max_steps=max_steps,
                                      eval_every=eval_every)
        from hpctrain.search import study as studies  # optuna: search sweeps only

        old = studies.existing_direction(sweep_dir)
        if old is not None and old != direction:
            problems.append(f"objective.mode: the study in {sweep_dir} was created to {old}; "
                            f"this command would {direction} (use a new sweep dir)")
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise LaunchError(f"nothing submitted: {len(problems)} problem(s):\n{lines}")
        assert sample is not None
        runs = [make_spec(i, space.fixed, SweepPaths(sweep_dir).worker_placeholder(i)) for i in range(settings.n_workers)]
        if launcher.params.dry_run:
            print(launcher.describe(runs, sweep_dir, calling=Calling.POSITIONAL).scripts())
            print(f"search: {settings.n_trials} trials, {len(runs)} worker(s), sampler={settings.sampler}, "
                  f"pruner={settings.pruner}, "
                  + (f"scheduler={settings.scheduler}, " if settings.scheduler != "none" else "")
                  + f"objective {metric or 'return value'} ({direction})")
            print("dry run: nothing submitted")
            return None

        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, SweepPaths(sweep_dir).multirun_yaml)
        study = studies.open_study(sweep_dir, settings)
        left = studies.work_left(study, settings)
        if left == 0:
            counts = studies.summary(study)
            print(f"hpctrain: the study in {sweep_dir} already has its {studies.budget(settings)} trials "
                  f"({_counts(counts)}): nothing to submit")
            return None
        runs = runs[: min(len(runs), left)]
        study.set_user_attr("hpctrain", {"metric": metric, "direction": direction, "sampler": settings.sampler,
                                         "pruner": settings.pruner, "n_trials": settings.n_trials,
                                         "scheduler": settings.scheduler, "min_steps": settings.min_steps,
                                         "eta": settings.eta, "max_steps": settings.max_steps,
                                         "params": {p.name: p.text for p in space.params}})
        with one_submission(sweep_dir):  # numbered and recorded one at a time (lock.py)
            queue_cancelled(sweep_dir, study)
            return self._submit(launcher, runs, settings, sweep_dir)

    def _submit(self, launcher: BaseLauncher, runs: List[RunSpec], settings: Any, sweep_dir: Path) -> Any:
        from hpctrain.search.worker import SearchWorker

        problems = launcher.plan_snapshot(sweep_dir)  # workers run the code as it was at submit time
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise LaunchError(f"nothing submitted: {len(problems)} problem(s):\n{lines}")
        submission = launcher.describe(runs, sweep_dir, calling=Calling.POSITIONAL)  # one worker per task
        launcher.stage(submission)
        def add(m: manifest.Manifest) -> None:
            m.launcher, m.app, m.submitit_folder, m.launcher_pid = (
                launcher.kind, getattr(self.task_function, "__module__", None),
                str(launcher.params.submitit_folder), os.getpid())
            m.search = {"n_trials": settings.n_trials, "sampler": settings.sampler, "pruner": settings.pruner,
                        "scheduler": settings.scheduler, "min_steps": settings.min_steps, "eta": settings.eta,
                        "max_steps": settings.max_steps, "workers": len(runs),
                        "metric": settings.metric, "direction": Direction.parse(settings.direction).optuna}
            if settings.scheduler == "pbt":  # its units' length, for the ETA (hpctrain.search.eta)
                m.search["interval"] = settings.interval or settings.eval_every
            m.submissions.append(manifest.SubmissionRecord(launcher_pid=os.getpid(), extra={"workers": len(runs)}))

        manifest.update(sweep_dir, add)
        # a new submission of each worker: an earlier interrupt's `cancelled` (the workers read it) no longer holds
        events.submitted_all(run.run_dir for run in runs)
        worker = SearchWorker(str(submission.files.payload), str(sweep_dir), settings)
        print(f"hpctrain: search of {settings.n_trials} trials ({settings.sampler}, pruner {settings.pruner}, "
              f"{settings.metric or 'return value'} {Direction.parse(settings.direction)}) by {len(runs)} worker(s)", flush=True)
        # the runs are workers: their job ids are recorded with the submission, not as runs of sweep.json
        jobs = launcher.send(submission, worker, lambda ids: self._record_workers(sweep_dir, list(ids.values())))
        ids = [str(j.job_id) for j in jobs]
        self._record_workers(sweep_dir, ids)
        if launcher.kind == "slurm":
            print(f"hpctrain: submitted {len(runs)} search worker(s) as Slurm job {ids[0].split('_')[0]}"
                  f"{' (one array)' if len(runs) > 1 else ''}")
            print_next_commands(sweep_dir)
            if not launcher.params.wait:
                return None
            from hpctrain.slurm import parse as slurm_parse
            from hpctrain.slurm import query as slurm

            progress = Progress([], discover=lambda: trials_of(sweep_dir))  # the trials, from their records
            slurm.poll_squeue(ids, 10.0, lambda q: not any(slurm_parse.in_queue(q, i) for i in ids),
                              lambda q: progress.update())
            progress.close()
        return self._final(sweep_dir, settings)

    @staticmethod
    def _record_workers(sweep_dir: Path, job_ids: List[str]) -> None:
        def add(m: manifest.Manifest) -> None:
            sub = m.last_submission()
            workers = sorted(set(sub.extra.get("worker_job_ids", [])) | set(job_ids))
            sub.extra["worker_job_ids"] = workers
            sub.job_ids = sorted({i.split("_")[0] for i in workers})

        manifest.update(sweep_dir, add)

    def _final(self, sweep_dir: Path, settings: Any) -> Any:
        """After the workers ended (local, or ``wait=true``): the counts and the best trial."""
        from hpctrain.search import study as studies

        study = studies.open_study(sweep_dir, settings)
        counts = studies.summary(study)
        print(f"search {sweep_dir}: {_counts(counts)}")
        try:
            best = study.best_trial
            said = _pbt_params(sweep_dir, best.number) if settings.scheduler == "pbt" else ""
            print(f"  best: trial {best.number} {settings.metric or 'value'}={best.value:.6g} "
                  f"{said or ('params ' + str(best.params))}")
        except ValueError:
            print("  no trial completed")
        print(f"  Next: python -m hpctrain report {sweep_dir}")
        if counts.get("fail"):
            raise LaunchError(f"{counts['fail']} of {sum(counts.values())} trial(s) failed: their metrics.json "
                              f"hold the errors")
        return None

    # ------------------------------------------------------------------ checks
    def _check_settings(self) -> List[str]:
        c, problems = self.conf, []
        for key in ("n_trials", "n_workers"):
            if not isinstance(c[key], int) or c[key] < 1:
                problems.append(f"hydra.sweeper.{key}={c[key]}: expected an integer >= 1")
        if c.sampler not in SAMPLERS:
            problems.append(f"hydra.sweeper.sampler={c.sampler}: unknown sampler (expected one of {', '.join(SAMPLERS)})")
        else:
            missing = [m for m in SAMPLER_NEEDS.get(str(c.sampler), ()) if importlib.util.find_spec(m) is None]
            if missing:
                problems.append(f"hydra.sweeper.sampler={c.sampler}: Optuna's sampler needs {', '.join(missing)} "
                                f"(pip install {' '.join(missing)})")
        if c.pruner not in PRUNERS:
            problems.append(f"hydra.sweeper.pruner={c.pruner}: unknown pruner (expected one of {', '.join(PRUNERS)})")
        if float(c.grace_s) <= 0 or float(c.heartbeat_s) <= 0:
            problems.append("hydra.sweeper.grace_s and heartbeat_s: expected numbers > 0")
        if c.seed is not None and not isinstance(c.seed, int):
            problems.append(f"hydra.sweeper.seed={c.seed}: expected an integer")
        return problems

    def _check_app(self, space: Space, sweep_dir: Path) -> "tuple[Optional[PlannedRun], List[str]]":
        """The keys exist in the app's config and one trial's config passes the launcher's checks."""
        assert self.hydra_context is not None and self.config is not None
        first = {p.name: (p.choices[0] if p.choices else (int(p.low or 0) if p.kind == "int" else p.low))
                 for p in space.params}
        runs, errors = plan_runs(self.hydra_context, self.config, [space.overrides(first)], 0)  # one composition
        launcher = implementation_of(self.launcher)
        if not errors and launcher is not None:
            problems = [p.replace("run 0 ", "a trial ", 1) for p in launcher.check(runs, sweep_dir)]
            return runs[0], problems
        # only on bad input: compose the fixed overrides alone to name the unknown keys
        base, fixed_errors = plan_runs(self.hydra_context, self.config, [list(space.fixed)], 0)
        if fixed_errors:
            return None, [e.replace("run 0 ", "fixed overrides ", 1) for e in fixed_errors]
        unknown = [f"{p.text}: unknown key {p.name!r} (not in the app's config; add a new key with +{p.name}=...)"
                   for p in space.params
                   if not p.key.startswith("+") and OmegaConf.select(base[0].cfg, p.name, default=_ABSENT) is _ABSENT]
        return None, unknown or [e.replace("run 0 ", "a trial ", 1) for e in errors]

    def _objective(self, sample: Optional[PlannedRun]) -> "tuple[Optional[str], str]":
        """``objective.metric`` and ``objective.mode`` from the app's config (hpctrain's: val/loss, min);
        an app without them is optimised by its return value, minimised."""
        cfg = sample.cfg if sample is not None else None
        default = contract_of(self.task_function).objective_metric
        metric = OmegaConf.select(cfg, "objective.metric", default=default) if cfg is not None else default
        mode = OmegaConf.select(cfg, "objective.mode", default=Direction.MIN.value) if cfg is not None else None
        return metric, Direction.parse(mode or Direction.MIN).optuna

    def _typed_conf(self) -> SearchSweeperConf:
        """The sweeper's settings as their dataclass (the plugin shell checked their types)."""
        return SearchSweeperConf(**OmegaConf.to_container(self.conf, resolve=True))  # type: ignore[arg-type]

    def _n_workers(self, launcher: BaseLauncher) -> int:
        c = self.conf
        n_workers = int(c.n_workers) if isinstance(c.n_workers, int) and c.n_workers > 0 else 1
        if isinstance(launcher, LocalLauncher):
            asked, n_workers = n_workers, launcher.max_parallel()  # local: max_parallel worker processes
            if n_workers < asked:
                print(f"hpctrain: hydra.sweeper.n_workers={asked}, but this machine runs {n_workers} run(s) at a "
                      f"time (hydra.launcher.max_parallel={n_workers}): {n_workers} worker(s)", file=sys.stderr)
        return n_workers


_ABSENT = object()


def _pbt_problems(space: Space, mutable: Optional[Collection[str]] = None) -> List[str]:
    """The PBT parameters' kinds (continuous or a choice) and, where the app names them (``mutable_keys``),
    the keys it can change mid-run: checked by the PBT scheduler's own module."""
    from hpctrain.search.pbt import check_params

    line = check_params(space, mutable)
    return [line] if line else []


def queue_cancelled(sweep_dir: Path, study: Any) -> None:
    """The trials an interrupt cancelled (still running in the study, their leases released) wait for this
    submission's workers: a new submission of each (queued), not shown ended while they wait."""
    from optuna.trial import TrialState

    m = manifest.read(sweep_dir)
    running = {t.number for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}
    for number, entry in (m.runs.items() if m is not None else []):
        if number in running and events.read(entry.spec.run_dir).state is State.CANCELLED:
            events.submitted(entry.spec.run_dir, trial=number)


def _counts(counts: Dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"


def _pbt_params(sweep_dir: Path, number: int) -> str:
    """A PBT trial's params said as ``report`` says them (final, and what its weights started with), from the
    trials' lineages in their metrics.json; "" when they are not there."""
    from hpctrain.core import summary
    from hpctrain.search import pbt

    found = manifest.read(sweep_dir)
    lineages = {}
    for n, entry in (found.runs if found is not None else {}).items():
        lineage = (summary.read(entry.spec.run_dir) or {}).get("lineage")
        if isinstance(lineage, list) and lineage:
            lineages[n] = lineage
    return pbt.params_said(pbt.schedule(number, lineages)) if number in lineages else ""
