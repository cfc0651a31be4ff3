"""The study of a search sweep: Optuna's journal file in the sweep dir, its samplers, pruners and tells.

No database server and no process on the login node: every worker opens the same journal
(``<sweep>/.hpctrain/study.journal``, Optuna's ``JournalFileBackend`` with its ``O_EXCL`` file lock,
which works on NFS, and a grace period after which a lock left by a killed process is broken; a torn
last write is set aside by :mod:`hpctrain.search.journal`). Who runs which trial: :mod:`hpctrain.search.leases`.

Paused trials (a scheduler's, :mod:`hpctrain.search.units`) stay RUNNING in Optuna, so the sampler of an
``asha``/``hyperband`` study (:class:`UnitSampler`) reads a trial that reported values as pruned at its last
step, as Optuna's samplers read a pruner's trials.

Imports optuna: used on the login node only for search sweeps.
"""

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, cast

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from hpctrain._compat import optuna as optuna_compat
from hpctrain.core.paths import SweepPaths
from hpctrain.core.state import Direction
from hpctrain.search import journal
from hpctrain.search.claims import lock_grace_s
from hpctrain.search.settings import Settings
from hpctrain.search.space import grid_size
from hpctrain.search.units import Scheduler

STUDY_NAME = "search"
SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
PRUNERS = ("median", "asha", "none")
# the package each optional sampler needs on the compute node (Optuna imports it lazily)
SAMPLER_NEEDS = {"cmaes": ("cmaes",), "gp": ("scipy", "torch")}
optuna.logging.set_verbosity(optuna.logging.WARNING)


def journal_path(sweep_dir: "str | Path") -> str:
    return str(SweepPaths(sweep_dir).study_journal)


def storage(sweep_dir: "str | Path", say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)
            ) -> JournalStorage:
    """The study's journal; a torn write in it is set aside first (and before every append)."""
    path = journal_path(sweep_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = journal.RepairingOpenLock(path, grace_period=lock_grace_s(), say=say)
    journal.repair(path, lock, say)
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


def exists(sweep_dir: "str | Path") -> bool:
    return os.path.exists(journal_path(sweep_dir))


WORKER_SEED_STRIDE = 1_000_003  # worker w samples with seed + w * stride: studies of seeds 0 and 1 share no stream


def worker_seed(seed: int, worker: int, restart: int = 0, trials: int = 0) -> int:
    """The seed of one worker's sampler. Worker ``w`` of a new study, on its first attempt, samples with
    ``seed + w * WORKER_SEED_STRIDE`` (worker 0 with ``seed``); a worker that opens a study holding ``trials``
    trials already (a rerun, a restart, a reopened study) or runs a later attempt (``SLURM_RESTART_COUNT``)
    mixes both into its seed: a sampler re-created from the same seed would draw TPE's start-up values
    again. Reproducible: the same seed, worker, attempt and study size give the same stream."""
    base = (int(seed) + worker * WORKER_SEED_STRIDE) % 2**32
    if restart == 0 and trials == 0:
        return base
    digest = hashlib.sha256(f"{base}:{restart}:{trials}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def build_sampler(settings: Settings, worker: int = 0, restart: int = 0, trials: int = 0
                  ) -> optuna.samplers.BaseSampler:
    """The sampler of one worker, seeded by :func:`worker_seed`; TPE lies constantly with several workers
    (a running trial counts as a bad one, so that parallel workers do not all sample the same point)."""
    seed = None if settings.seed is None else worker_seed(settings.seed, worker, restart, trials)
    inner = _sampler(settings, seed)
    return UnitSampler(inner) if settings.scheduler in ("asha", "hyperband") and settings.sampler != "grid" else inner


class UnitSampler(optuna.samplers.BaseSampler):
    """A sampler that reads a trial paused at a rung as pruned there
    (:class:`hpctrain._compat.optuna.PausedAsPruned`)."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self.inner = inner

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> Dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(_paused_as_pruned(study), trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: Dict[str, BaseDistribution]) -> Dict[str, Any]:
        return self.inner.sample_relative(_paused_as_pruned(study), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(_paused_as_pruned(study), trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Optional[Sequence[float]]) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def _paused_as_pruned(study: optuna.Study) -> optuna.Study:
    """The study as a sampler of paused trials reads it (a stand-in with the Study's calls)."""
    return cast(optuna.Study, optuna_compat.PausedAsPruned(study))


def _sampler(settings: Settings, seed: Optional[int]) -> optuna.samplers.BaseSampler:
    name = settings.sampler
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=settings.n_workers > 1)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({p.name: p.grid() for p in settings.space.params}, seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise ValueError(f"hydra.sweeper.sampler={name!r}: expected one of {', '.join(SAMPLERS)}")


def build_pruner(settings: Settings) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":
        # a trial's first eval is never pruned (Optuna prunes from step n_warmup_steps on): one value decides nothing
        first_eval = settings.first_eval_step or 0
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials,
                                           n_warmup_steps=first_eval + 1 if first_eval else 0)
    if settings.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"hydra.sweeper.pruner={settings.pruner!r}: expected one of {', '.join(PRUNERS)}")


def open_study(sweep_dir: "str | Path", settings: Settings, worker: int = 0) -> optuna.Study:
    """The sweep's study, with worker ``worker``'s sampler (seeded for this attempt and the study's size)."""
    study = optuna.create_study(storage=storage(sweep_dir), study_name=STUDY_NAME,
                                direction="maximize" if Direction.parse(settings.direction) is Direction.MAX else "minimize",
                                sampler=optuna.samplers.RandomSampler(), pruner=build_pruner(settings),
                                load_if_exists=True)
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)  # this worker's attempt (a requeue: the next)
    study.sampler = build_sampler(settings, worker, restart, len(study.get_trials(deepcopy=False)))
    return study


STORAGE_ERRORS = (OSError, ValueError, RuntimeError)  # a torn journal, an NFS hiccup, a broken lock
REPORT_RETRIES = 3
REPORT_BACKOFF_S = 0.5  # then 1 s, 2 s: a report waits at most a few seconds inside the trainer's eval


def retrying_trial(trial: optuna.Trial, sweep_dir: "str | Path | None", what: str,
                   call: Callable[[optuna.Trial], Any], say: Callable[[str], None] = print
                   ) -> "tuple[optuna.Trial, Any]":
    """``call(trial)``, again on the trial of a freshly opened study after a storage error (as the worker
    retries its own calls), a few times; then the error is raised. Returns the trial used last, and what the
    call returned. ``sweep_dir`` None: no study to reopen, the call is made once."""
    fresh = False
    for attempt in range(REPORT_RETRIES + 1):
        try:
            if fresh and sweep_dir is not None:
                study = optuna.load_study(study_name=STUDY_NAME, storage=storage(sweep_dir, say),
                                          sampler=trial.study.sampler, pruner=trial.study.pruner)
                trial = optuna_compat.live_trial(study, optuna_compat.trial_id(trial))
            return trial, call(trial)
        except STORAGE_ERRORS as exc:
            if attempt == REPORT_RETRIES or sweep_dir is None:
                raise
            say(f"hpctrain search: trial {trial.number}: {what}: {type(exc).__name__}: {exc}; retrying")
            time.sleep(REPORT_BACKOFF_S * 2 ** attempt)
            fresh = True
    raise AssertionError("unreachable")


def existing_direction(sweep_dir: "str | Path") -> Optional[str]:
    """The direction of the study already in the sweep dir (a rerun), or None."""
    if not exists(sweep_dir):
        return None
    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage(sweep_dir))
    except KeyError:
        return None
    return Direction.parse(study.direction).optuna


def budget(settings: Settings) -> int:
    """``n_trials``, or the grid's size when that is smaller (a grid is done once every point ran)."""
    if settings.sampler == "grid":
        return min(settings.n_trials, grid_size(settings.space))
    return settings.n_trials


def build_scheduler(settings: Settings) -> Optional[Scheduler]:
    """The study's scheduler; None for ``none`` (each trial one run to max_steps, as before schedulers)."""
    name = settings.scheduler
    if name == "none":
        return None
    assert settings.max_steps, "a scheduler needs the app's max_steps (checked on the login node)"
    first = int(settings.min_steps or settings.eval_every or 1)
    if name == "asha":
        from hpctrain.search.asha import Asha

        return Asha(first, settings.eta, settings.max_steps)
    if name == "hyperband":
        from hpctrain.search.asha import hyperband

        return hyperband(first, settings.eta, settings.max_steps)
    if name == "pbt":
        from hpctrain.search import pbt  # the population's scheduler (its own module)

        return pbt.scheduler(settings)
    raise ValueError(f"hydra.sweeper.scheduler={name!r}: expected one of none, asha, hyperband, pbt")


def suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """``trial.suggest_*`` for a distribution (Optuna's public calls)."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    raise TypeError(f"{name}: unexpected distribution {dist!r}")


def settle_failed(study: optuna.Study, trial: FrozenTrial, why: str) -> None:
    try:  # the reason first: a finished trial takes no more attributes
        optuna_compat.set_trial_system_attr(study, optuna_compat.trial_id(trial), "hpctrain:failed", why)
        study.tell(trial.number, state=TrialState.FAIL)
    except (ValueError, RuntimeError):  # UpdateFinishedTrialError is a RuntimeError
        return  # someone else settled it


def tell(study: optuna.Study, number: int, state: TrialState, value: Optional[float] = None) -> bool:
    """Tell the study how a trial ended; False when it had already been settled (by another worker)."""
    try:
        if state == TrialState.COMPLETE:
            study.tell(number, value)
        else:
            study.tell(number, state=state)
    except RuntimeError as exc:
        # GridSampler.after_trial calls study.stop() once the grid is used up, which raises outside
        # study.optimize; the state was stored before that (Optuna stores it in a `finally`)
        return "Study.stop" in str(exc)
    except ValueError:
        return False
    return True


def summary(study: optuna.Study) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    return counts


def work_left(study: optuna.Study, settings: Settings) -> int:
    """Trials still to ask plus trials running (which may need a worker to settle them)."""
    trials = study.get_trials(deepcopy=False)
    open_ = sum(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    return max(0, budget(settings) - len(trials)) + open_

