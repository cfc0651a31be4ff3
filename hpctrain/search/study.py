"""The study of a search sweep: Optuna's journal file in the sweep dir, and who runs which trial.

No database server and no process on the login node: every worker opens the same journal
(``<sweep>/.hpctrain/study.journal``, Optuna's ``JournalFileBackend`` with its ``O_EXCL`` file lock,
which works on NFS, and a grace period after which a lock left by a killed process is broken).

Who runs which trial is decided under one more such lock (``trials``): a worker first takes back its
own unfinished trial (it was preempted and requeued), then adopts a trial whose worker is gone (its
Slurm job left the queue, its local process died, or its heartbeat is older than ``grace_s``), and
only then asks the sampler for a new trial, while fewer than ``n_trials`` trials exist. Deciding and
asking under the lock is what keeps the study at exactly ``n_trials`` with several workers racing.
A trial's owner is written in its lease (``<sweep>/.hpctrain/trials/<number>.json``); the owner
touches ``<number>.<owner>.alive`` as its heartbeat.

Imports optuna: used on the login node only for search sweeps.
"""

import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, TrialState

from hpctrain._compat import optuna as optuna_compat
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.state import Direction
from hpctrain.search.space import Space, grid_size

STUDY_NAME = "search"
LOCK_GRACE_S = 30  # a lock file untouched this long was left by a killed process: broken
SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
PRUNERS = ("median", "asha", "none")
# the package each optional sampler needs on the compute node (Optuna imports it lazily)
SAMPLER_NEEDS = {"cmaes": ("cmaes",), "gp": ("scipy", "torch")}
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class Settings:
    """What the sweeper decided on the login node; pickled into every worker."""

    space: Space
    n_trials: int
    n_workers: int
    sampler: str = "tpe"
    pruner: str = "median"
    seed: Optional[int] = None
    metric: Optional[str] = "val/loss"  # None: the task function's return value itself
    direction: str = Direction.MIN.optuna  # Optuna's spelling
    grace_s: int = 60  # a trial whose heartbeat is older than this (and whose job is unknown) is adopted
    heartbeat_s: float = 10.0
    max_adoptions: int = 2  # a trial whose worker died this many times ends failed
    extra: Dict[str, Any] = field(default_factory=dict)


def search_dir(sweep_dir: "str | Path") -> Path:
    return SweepPaths(sweep_dir).hpctrain


def journal_path(sweep_dir: "str | Path") -> str:
    return str(SweepPaths(sweep_dir).study_journal)


def storage(sweep_dir: "str | Path") -> JournalStorage:
    path = journal_path(sweep_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path, grace_period=LOCK_GRACE_S)))


def exists(sweep_dir: "str | Path") -> bool:
    return os.path.exists(journal_path(sweep_dir))


def build_sampler(settings: Settings, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler of one worker: its own seed (``seed + worker``); TPE lies constantly with several workers
    (a running trial counts as a bad one, so that parallel workers do not all sample the same point)."""
    seed = None if settings.seed is None else int(settings.seed) + worker
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
        return optuna.pruners.MedianPruner(n_startup_trials=min(4, max(1, settings.n_trials // 4)))
    if settings.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"hydra.sweeper.pruner={settings.pruner!r}: expected one of {', '.join(PRUNERS)}")


def open_study(sweep_dir: "str | Path", settings: Settings, worker: int = 0) -> optuna.Study:
    return optuna.create_study(storage=storage(sweep_dir), study_name=STUDY_NAME, direction=settings.direction,
                               sampler=build_sampler(settings, worker), pruner=build_pruner(settings),
                               load_if_exists=True)


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


# ---------------------------------------------------------------- leases
def leases_dir(sweep_dir: "str | Path") -> str:
    return str(SweepPaths(sweep_dir).trials)


def lease_path(sweep_dir: "str | Path", number: int) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.json")


def alive_path(sweep_dir: "str | Path", number: int, owner: str) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.{owner.replace('/', '_')}.alive")


def read_lease(sweep_dir: "str | Path", number: int) -> Optional[Dict[str, Any]]:
    return read_json(lease_path(sweep_dir, number))


def write_lease(sweep_dir: "str | Path", number: int, owner: str, **fields: Any) -> Dict[str, Any]:
    lease = {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), **fields}
    write_json_atomic(lease_path(sweep_dir, number), lease)
    touch(alive_path(sweep_dir, number, owner))
    return lease


def touch(path: str) -> None:
    with open(path, "a"):
        os.utime(path)


def heartbeat_age(sweep_dir: "str | Path", number: int, owner: str) -> float:
    try:
        return time.time() - os.stat(alive_path(sweep_dir, number, owner)).st_mtime
    except OSError:
        return float("inf")


def owner_gone(lease: Dict[str, Any]) -> Optional[bool]:
    """Whether the lease's worker is certainly gone: True (its job left the queue, its process died),
    False (still queued or running), None (cannot tell: go by the heartbeat)."""
    job_id = lease.get("slurm_job_id")
    if job_id:
        from hpctrain.slurm import parse as slurm_parse
        from hpctrain.slurm import query as slurm

        queue = slurm.squeue([job_id])
        if queue is None:
            return None  # the query failed: unknown, never gone
        return not slurm_parse.in_queue(queue, job_id)
    if lease.get("host") == socket.gethostname() and lease.get("pid"):
        try:
            os.kill(int(lease["pid"]), 0)
        except ProcessLookupError:
            return True
        except OSError:
            return None
        return _is_zombie(int(lease["pid"]))
    return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def lease_lost(sweep_dir: "str | Path", number: int, lease: Optional[Dict[str, Any]], settings: Settings) -> bool:
    """A running trial nobody works on any more."""
    if lease is None:
        return True  # asked, then its worker died before it wrote the lease (cannot happen under the lock)
    age = heartbeat_age(sweep_dir, number, str(lease["owner"]))
    if age < min(settings.grace_s, 3 * settings.heartbeat_s):
        return False  # beating: alive, whatever the queue says (and no squeue call)
    gone = owner_gone(lease)
    if gone is not None:
        return gone  # a requeued worker still in the queue keeps its trial
    return age > settings.grace_s


@contextmanager
def trials_lock(sweep_dir: "str | Path") -> Iterator[None]:
    lock = JournalFileOpenLock(str(SweepPaths(sweep_dir).trials), grace_period=LOCK_GRACE_S)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


# ---------------------------------------------------------------- deciding the next trial
@dataclass
class Assignment:
    """A trial for one worker: a new one, its own again after a requeue, or one adopted from a dead worker."""

    number: int
    trial_id: int
    params: Dict[str, Any]
    how: str  # new | resumed | adopted
    adoptions: int = 0


def next_trial(study: optuna.Study, settings: Settings, sweep_dir: "str | Path", me: str,
               owner_fields: Dict[str, Any]) -> Optional[Assignment]:
    """Under :func:`trials_lock`: this worker's next trial, or None when the study needs no more work."""
    os.makedirs(leases_dir(sweep_dir), exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    running = [t for t in trials if t.state == TrialState.RUNNING]
    for t in running:  # our own, from before a requeue
        lease = read_lease(sweep_dir, t.number)
        if lease is not None and lease.get("owner") == me:
            write_lease(sweep_dir, t.number, me, adoptions=lease.get("adoptions", 0), **owner_fields)
            return Assignment(t.number, optuna_compat.trial_id(t), dict(t.params), "resumed",
                              int(lease.get("adoptions", 0)))
    for t in running:  # a dead worker's
        lease = read_lease(sweep_dir, t.number)
        if not lease_lost(sweep_dir, t.number, lease, settings):
            continue
        adoptions = int((lease or {}).get("adoptions", 0)) + 1
        if adoptions > settings.max_adoptions:
            settle_failed(study, t, f"its worker died {adoptions - 1} time(s) while running it")
            continue
        write_lease(sweep_dir, t.number, me, adoptions=adoptions, **owner_fields)
        return Assignment(t.number, optuna_compat.trial_id(t), dict(t.params), "adopted", adoptions)
    if len(trials) >= budget(settings):
        return None
    trial = study.ask({p.name: p.distribution() for p in settings.space.params})
    write_lease(sweep_dir, trial.number, me, adoptions=0, **owner_fields)
    return Assignment(trial.number, optuna_compat.trial_id(trial), dict(trial.params), "new")


def settle_failed(study: optuna.Study, trial: FrozenTrial, why: str) -> None:
    try:
        # the reason first: a finished trial's attributes can no longer be set
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


def trial_rows(trials: List[FrozenTrial]) -> List[Dict[str, Any]]:
    return [{"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": dict(t.params)}
            for t in trials]
