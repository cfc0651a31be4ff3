"""The study of a search sweep: Optuna's journal file in the sweep dir, and who runs which trial.

No database server and no process on the login node: every worker opens the same journal
(``<sweep>/.hpctrain/study.journal``, Optuna's ``JournalFileBackend`` with its ``O_EXCL`` file lock,
which works on NFS, and a grace period after which a lock left by a killed process is broken; a torn
last write is set aside by :mod:`hpctrain.search.journal`).

Claims and leases. A trial's lease is a series of claim files ``<sweep>/.hpctrain/trials/<n>.<gen>.claim``
(``<n>.json`` is a readable copy of the newest); the claim of the highest generation ``gen`` names the
owner. A claim is created whole and exclusively (a hard link), so of two workers claiming the same
generation exactly one wins, even when the lock below was broken. A worker:

1. looks, under no lock: the owner of every running trial that is not beating (its
   ``<n>.<owner>.alive`` file, touched every ``heartbeat_s``) is asked about: one ``squeue`` for the
   Slurm jobs, a process check for local workers. A failed query is *unknown*, never gone;
2. decides, under the short ``trials`` lock (files and the journal only, nothing slow): its own trial
   after a requeue (claims ``gen + 1``); else a trial whose owner is known gone (its job left the queue,
   its process died, it released the trial at a time limit), if the lease is still the generation it
   looked at and has not beaten since; else, while fewer than ``n_trials`` exist, it claims the next
   number (generation 1) and only then asks Optuna for the trial, so the study never passes
   ``n_trials``. An owner nobody can ask about loses its trial when its heartbeat is older than
   ``grace_s``; an unknown one keeps it (the worker waits and looks again);
3. samples the parameters (the sampler's work) with no lock held;
4. commits (tells the study) only if the lease still holds the generation it claimed.

Each takeover of a dead owner's trial counts toward ``max_adoptions``; a release does not.

Units (a scheduler other than ``none``, :mod:`hpctrain.search.units`). A lease carries the unit its holder
runs (``unit``: start and end step, rung or interval). A unit that ends before ``max_steps`` leaves the
trial paused: the next generation of its lease is marked ``paused`` (its trial stays RUNNING in Optuna, its
objective at the end step reported), and adoption leaves it alone. In step 2, after the trials of gone
owners, the scheduler picks from a view of the study (:meth:`Leases.view`): a paused trial's next unit is
claimed as the next generation of its lease (so of two promoters one wins, and a trial leaves a rung once),
a new trial as before (its number claimed first: ``n_trials`` is never passed). When the scheduler has
nothing left and no unit runs, every paused trial's lease is marked ``ended`` and the trial told pruned.
Paused trials stay RUNNING in Optuna, so the sampler of an ``asha``/``hyperband`` study (:class:`UnitSampler`)
reads a trial that reported values as pruned at its last step, as Optuna's samplers read a pruner's trials.

Imports optuna: used on the login node only for search sweeps.
"""

import json
import os
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from hpctrain._compat import optuna as optuna_compat
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.state import Direction, State
from hpctrain.search import journal
from hpctrain.search.space import Space, grid_size
from hpctrain.search.units import Next, Scheduler, StudyView, TrialView, Unit, UnitKind

STUDY_NAME = "search"
LOCK_GRACE_S = 30  # a lock file untouched this long was left by a killed process: broken
LOCK_GRACE_ENV = "HPCTRAIN_SEARCH_LOCK_GRACE_S"  # tests shorten the grace period
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
    min_time_left_s: float = 180.0  # a worker closer than this to its time limit starts no new trial
    # the scheduler (hpctrain.search.units): none (a trial is one unit to max_steps) | asha | hyperband | pbt
    scheduler: str = "none"
    max_steps: Optional[int] = None  # the app's max_steps (the last rung); read from its config on the login node
    eval_every: Optional[int] = None
    min_steps: Optional[int] = None
    eta: int = 3
    population: int = 8
    interval: Optional[int] = None
    quantile: float = 0.25
    resample_p: float = 0.25
    extra: Dict[str, Any] = field(default_factory=dict)


def search_dir(sweep_dir: "str | Path") -> Path:
    return SweepPaths(sweep_dir).hpctrain


def journal_path(sweep_dir: "str | Path") -> str:
    return str(SweepPaths(sweep_dir).study_journal)


def lock_grace_s() -> int:
    return int(os.environ.get(LOCK_GRACE_ENV) or LOCK_GRACE_S)


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


def build_sampler(settings: Settings, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler of one worker: its own seed (``seed + worker * WORKER_SEED_STRIDE``; worker 0 uses ``seed``);
    TPE lies constantly with several workers (a running trial counts as a bad one, so that parallel workers
    do not all sample the same point)."""
    seed = None if settings.seed is None else (int(settings.seed) + worker * WORKER_SEED_STRIDE) % 2**32
    inner = _sampler(settings, seed)
    return UnitSampler(inner) if settings.scheduler in ("asha", "hyperband") and settings.sampler != "grid" else inner


class UnitSampler(optuna.samplers.BaseSampler):
    """A sampler that reads a trial paused at a rung as pruned there
    (:class:`hpctrain._compat.optuna.PausedAsPruned`)."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self.inner = inner

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> Dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(optuna_compat.PausedAsPruned(study), trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: Dict[str, BaseDistribution]) -> Dict[str, Any]:
        return self.inner.sample_relative(optuna_compat.PausedAsPruned(study), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(optuna_compat.PausedAsPruned(study), trial, param_name,
                                             param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Optional[List[float]]) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


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


MEDIAN_STARTUP_TRIALS = 5  # Optuna's own default: fewer trials to compare against prune most of a small study


def build_pruner(settings: Settings) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":
        # a trial's first eval is never pruned (Optuna prunes from step n_warmup_steps on): one value decides nothing
        first_eval = int(settings.extra.get("first_eval_step", 0))
        startup = int(settings.extra.get("startup_trials", MEDIAN_STARTUP_TRIALS))
        return optuna.pruners.MedianPruner(n_startup_trials=startup,
                                           n_warmup_steps=first_eval + 1 if first_eval else 0)
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
class Owner(Enum):
    """What a worker found out about the owner of a running trial."""

    ALIVE = "alive"  # beating, or its job is in the queue, or its process runs
    GONE = "gone"  # known gone: the queue answered without its job, its process is dead, or it let go
    UNKNOWN = "unknown"  # a query failed: keeps its trial (never read as gone)


QueueAnswer = Callable[[List[str]], Optional[Set[str]]]  # the job ids still in the queue; None: unknown
ProcessAnswer = Callable[[int], Owner]


def leases_dir(sweep_dir: "str | Path") -> str:
    return str(SweepPaths(sweep_dir).trials)


def lease_path(sweep_dir: "str | Path", number: int) -> str:
    """The readable copy of a trial's current lease (the claim files are the truth)."""
    return os.path.join(leases_dir(sweep_dir), f"{number}.json")


def claim_path(sweep_dir: "str | Path", number: int, gen: int) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.{gen}.claim")


def alive_path(sweep_dir: "str | Path", number: int, owner: str) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.{owner.replace('/', '_')}.alive")


def read_leases(sweep_dir: "str | Path", claims: Optional[Dict[str, Dict[str, Any]]] = None
                ) -> Dict[int, Dict[str, Any]]:
    """Every trial's current lease: its claim of the highest generation (one directory listing).
    ``claims``: the claim files read before (path -> content), kept by the caller: a claim file is created
    whole and never written again (a new generation is a new file), so its content is read once."""
    newest: Dict[int, int] = {}
    legacy: Set[int] = set()
    try:
        names = os.listdir(leases_dir(sweep_dir))
    except OSError:
        return {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[2] == "claim" and parts[0].isdigit() and parts[1].isdigit():
            number, gen = int(parts[0]), int(parts[1])
            newest[number] = max(gen, newest.get(number, 0))
        elif len(parts) == 2 and parts[1] == "json" and parts[0].isdigit():
            legacy.add(int(parts[0]))
    out: Dict[int, Dict[str, Any]] = {}
    for number, gen in newest.items():
        path = claim_path(sweep_dir, number, gen)
        lease = claims.get(path) if claims is not None else None
        if lease is None:
            lease = read_json(path)
            if lease is not None and claims is not None:
                claims[path] = lease
        if lease is not None:
            out[number] = {**lease, "gen": gen}
    for number in legacy - set(out):  # a study begun before claims: its lease is generation 0
        lease = read_json(lease_path(sweep_dir, number))
        if lease is not None:
            out[number] = {**lease, "gen": 0}
    return out


def read_lease(sweep_dir: "str | Path", number: int,
               claims: Optional[Dict[str, Dict[str, Any]]] = None) -> Optional[Dict[str, Any]]:
    return read_leases(sweep_dir, claims).get(number)


def claim(sweep_dir: "str | Path", number: int, gen: int, owner: str, now: float,
          **fields: Any) -> Optional[Dict[str, Any]]:
    """Make ``owner`` the holder of generation ``gen`` of the trial's lease, or None when someone else
    claimed that generation first. The claim file is created whole and exclusively (a hard link fails
    when the name exists, on NFS too), so two claimants of one generation never both win, lock or no lock."""
    os.makedirs(leases_dir(sweep_dir), exist_ok=True)
    lease = {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(), "since": now, "gen": gen,
             "number": number, **fields}
    path = claim_path(sweep_dir, number, gen)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as f:
        json.dump(lease, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        won = True
    except FileExistsError:
        won = os.stat(tmp).st_nlink == 2  # NFS: a retried link answers EEXIST although it was ours
    finally:
        os.unlink(tmp)
    if not won:
        return None
    write_json_atomic(Path(lease_path(sweep_dir, number)), lease)
    touch(alive_path(sweep_dir, number, owner), now)
    return lease


def touch(path: str, now: Optional[float] = None) -> None:
    with open(path, "a"):
        os.utime(path, None if now is None else (now, now))


def heartbeat_age(sweep_dir: "str | Path", number: int, owner: str, now: Optional[float] = None) -> float:
    try:
        return (time.time() if now is None else now) - os.stat(alive_path(sweep_dir, number, owner)).st_mtime
    except OSError:
        return float("inf")


def slurm_queue(job_ids: List[str]) -> Optional[Set[str]]:
    """The jobs of ``job_ids`` still in Slurm's queue; None when squeue could not answer. Asked of the batch
    script's host side inside a job (the worker may run in an image without Slurm): :func:`hpctrain.slurm.host.squeue`."""
    from hpctrain.slurm import host
    from hpctrain.slurm import parse as slurm_parse

    queue = host.squeue(job_ids)
    if queue is None:
        return None
    return {j for j in job_ids if slurm_parse.in_queue(queue, j)}


def process_state(pid: int) -> Owner:
    """A process of this host: alive, gone (dead or a zombie), or unknown (cannot be asked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Owner.GONE
    except OSError:
        return Owner.UNKNOWN
    return Owner.GONE if _is_zombie(pid) else Owner.ALIVE


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def trials_lock(sweep_dir: "str | Path") -> Iterator[None]:
    """A short lock for quick decisions (never held across a slow call). It may be broken by a waiter
    after its grace period: what must not be decided twice is fenced by :func:`claim`, not by it."""
    lock = journal.PromptOpenLock(str(SweepPaths(sweep_dir).trials), grace_period=lock_grace_s())
    lock.acquire()
    try:
        yield
    finally:
        try:
            lock.release()
        except RuntimeError:
            pass  # broken by a waiter while we held it: our claims were fenced all the same


# ---------------------------------------------------------------- deciding the next trial
@dataclass
class Assignment:
    """A trial for one worker: a new one, its own again after a requeue, or one adopted from a dead worker."""

    number: int
    trial_id: int
    params: Dict[str, Any]
    how: str  # new | resumed | adopted
    adoptions: int = 0
    gen: int = 0  # the lease generation this worker holds: checked at commit
    trial: Any = field(default=None, repr=False)  # the optuna.Trial just asked (new trials)
    unit: Optional[Unit] = None  # what to run (a scheduler's unit); None: the whole trial (scheduler=none)
    dir_params: Optional[Dict[str, Any]] = None  # the values its run dir is named by, when ``params`` changed (PBT)


@dataclass
class Seen:
    """What :meth:`Leases.look` found out about a running trial's owner, outside the lock."""

    gen: int
    state: Owner
    beating: bool = False  # its heartbeat was fresh: ALIVE by that alone, or GONE although fresh (asked anyway)


class Leases:
    """One worker's side of the claim protocol (see the module docstring). ``clock``, ``queue`` and
    ``process`` are what the tests replace: no real sleeping, no real squeue."""

    def __init__(self, sweep_dir: "str | Path", settings: Settings, me: str, fields: Dict[str, Any],
                 clock: Callable[[], float] = time.time, queue: QueueAnswer = slurm_queue,
                 process: ProcessAnswer = process_state) -> None:
        self.sweep_dir, self.settings, self.me, self.fields = sweep_dir, settings, me, fields
        self.clock, self.queue, self.process = clock, queue, process
        self.gone_jobs: Set[str] = set()  # a job the queue answered without: gone for good (a requeue keeps its id queued)
        self.scheduler = build_scheduler(settings)
        self.ended: List[Any] = []  # (number, step, params) of paused trials this worker ended pruned
        self.claims: Dict[str, Dict[str, Any]] = {}  # claim files read so far (read_leases)
        # writes an ended trial's record (the worker's; quick file writes): called before the study is told
        self.end_hook: Callable[[int, Optional[int], Dict[str, Any]], None] = lambda *e: self.ended.append(e)

    # ------------------------------------------------------------ facts, outside the lock
    def _window(self) -> float:
        s = self.settings
        return min(s.grace_s, 3 * s.heartbeat_s)

    def _age(self, number: int, lease: Dict[str, Any]) -> float:
        return heartbeat_age(self.sweep_dir, number, str(lease["owner"]), self.clock())

    def look(self, study: optuna.Study, confirm: bool = False) -> Dict[int, Seen]:
        """The state of the owner of every running trial that is not this worker's; slow calls (one
        squeue for all the jobs, process checks) are made here, under no lock. ``confirm``: ask the queue
        about beating Slurm owners too (a killed job's heartbeat stays fresh for a few seconds)."""
        running = [t.number for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        leases = read_leases(self.sweep_dir, self.claims)
        seen: Dict[int, Seen] = {}
        ask: Dict[int, str] = {}
        beating: Dict[int, bool] = {}
        for number in running:
            lease = leases.get(number)
            if lease is None or lease.get("owner") == self.me or _resting(lease):
                continue
            beating[number] = self._age(number, lease) < self._window()
            state = self._without_queue(number, lease, confirm)
            if state is None:
                ask[number] = str(lease["slurm_job_id"])
            else:
                seen[number] = Seen(int(lease["gen"]), state, beating[number])
        if ask:
            in_queue = self.queue(sorted(set(ask.values())))
            for number, job in ask.items():
                if in_queue is None:
                    state = Owner.UNKNOWN  # a failed query: unknown, never gone
                elif job in in_queue:
                    state = Owner.ALIVE
                else:
                    self.gone_jobs.add(job)
                    state = Owner.GONE
                seen[number] = Seen(int(leases[number]["gen"]), state, beating[number])
        return seen

    def _without_queue(self, number: int, lease: Dict[str, Any], confirm: bool = False) -> Optional[Owner]:
        """The owner's state when the queue need not be asked; None: ask it."""
        if lease.get("released"):
            return Owner.GONE  # let go at a time limit: resumable at once, no adoption counted
        job = lease.get("slurm_job_id")
        local = not job and lease.get("host") == socket.gethostname() and lease.get("pid")
        if local and self.process(int(lease["pid"])) == Owner.GONE:
            return Owner.GONE  # a dead process beats no more: no need to wait for its heartbeat to age
        age = self._age(number, lease)
        if age < self._window() and not (confirm and job):
            return Owner.ALIVE  # beating: alive, whatever the queue says
        if job:
            return Owner.GONE if str(job) in self.gone_jobs else None
        if local:
            return self.process(int(lease["pid"]))
        # nobody can be asked about this owner: its heartbeat is all there is
        return Owner.GONE if age > self.settings.grace_s else Owner.UNKNOWN

    # ------------------------------------------------------------ the decision, under the lock
    def next_trial(self, study: optuna.Study) -> "Assignment | Next":
        """This worker's next trial, or why there is none now. Facts first (no lock), then the decision
        under :func:`trials_lock` (quick: files and the journal only), then the sampler (no lock)."""
        seen = self.look(study)
        with trials_lock(self.sweep_dir):
            got = self.decide(study, seen)
        if got is Next.DONE and any(f.beating and f.state == Owner.ALIVE for f in seen.values()):
            # before the last free worker leaves, owners thought alive by their heartbeat alone are
            # asked about: one squeue at the end of the study, none per trial
            seen = self.look(study, confirm=True)
            with trials_lock(self.sweep_dir):
                got = self.decide(study, seen)
        if isinstance(got, Assignment):
            self._fill_params(study, got)
        return got

    def decide(self, study: optuna.Study, seen: Dict[int, Seen]) -> "Assignment | Next":
        s, me, now = self.settings, self.me, self.clock()
        trials = study.get_trials(deepcopy=False)
        leases = read_leases(self.sweep_dir, self.claims)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        undecided = False
        for t in running:  # our own, from before a requeue
            lease = leases.get(t.number)
            if lease is not None and lease.get("owner") == me and not lease.get("released") and not _resting(lease):
                adoptions = int(lease.get("adoptions", 0))
                if self._claim(t.number, int(lease["gen"]) + 1, adoptions, unit=lease.get("unit")) is not None:
                    return self._assignment(t, "resumed", adoptions, int(lease["gen"]) + 1, lease.get("unit"))
        for t in running:  # a gone worker's
            lease = leases.get(t.number)
            if lease is None:  # asked, then its asker died before its claim was read: by the trial's age
                if now - t.datetime_start.timestamp() <= s.grace_s:
                    undecided = True
                    continue
                lease = {"gen": 0, "adoptions": 0}
            elif lease.get("paused"):
                continue  # between units: the scheduler's to resume, nobody's to adopt
            elif lease.get("ended"):  # its ender died between its claim and the tell: finish the ending
                self.end_hook(t.number, lease.get("step"), dict(t.params))
                tell(study, t.number, TrialState.PRUNED)
                continue
            elif lease.get("released"):
                pass  # let go at a time limit: anyone resumes it
            elif lease.get("owner") == me:
                continue  # ours, and someone claimed it again first
            else:
                fact = seen.get(t.number)
                if fact is None or fact.gen != int(lease["gen"]) or fact.state == Owner.UNKNOWN:
                    undecided = True  # not looked at, or changed hands since: look again
                    continue
                if fact.state == Owner.ALIVE:
                    continue
                dead = fact.state == Owner.GONE and (fact.beating or not lease.get("slurm_job_id")
                                                     and lease.get("host") == socket.gethostname())
                if not dead and self._age(t.number, lease) < self._window():
                    continue  # it beat since we looked (a requeued job, running again)
            released = bool(lease.get("released"))
            adoptions = int(lease.get("adoptions", 0)) + (0 if released else 1)
            gen = int(lease["gen"]) + 1
            if self._claim(t.number, gen, adoptions, unit=lease.get("unit")) is None:
                continue  # another worker took it first
            if adoptions > s.max_adoptions:
                settle_failed(study, t, f"its worker died {adoptions - 1} time(s) while running it")
                continue
            return self._assignment(t, "adopted", adoptions, gen, lease.get("unit"))
        number = len(trials)
        unit: Optional[Unit] = None
        if self.scheduler is not None:
            view = self.view(study, trials, leases)
            picked = self.scheduler.next_unit(view)
            if isinstance(picked, Next):
                if picked is Next.DONE and not undecided:
                    self._end_stranded(study, view, leases)
                return Next.WAIT if undecided else picked
            if picked.kind is not UnitKind.NEW:
                return self._resume(study, picked, leases)
            unit = picked.numbered(number)
        if number >= budget(s):
            return Next.WAIT if undecided else Next.DONE
        lease = leases.get(number)  # the next number's claim: its claimant is asking now, or died asking
        if lease is not None and now - float(lease.get("since", 0)) <= s.grace_s:
            return Next.WAIT
        gen = (int(lease["gen"]) if lease else 0) + 1
        if self._claim(number, gen, 0, unit=unit.fields() if unit else None) is None:
            return Next.WAIT
        trial = study.ask()  # the sampler's per-parameter work waits for _fill_params, outside the lock
        if trial.number != number:  # someone asked without claiming first (not hpctrain): claim what we got
            gen = int((read_lease(self.sweep_dir, trial.number, self.claims) or {"gen": 0})["gen"]) + 1
            unit = unit.numbered(trial.number) if unit else None
            if self._claim(trial.number, gen, 0, unit=unit.fields() if unit else None) is None:
                return Next.WAIT
        return Assignment(trial.number, optuna_compat.trial_id(trial), {}, "new", 0, gen, trial, unit)

    # ------------------------------------------------------------ units (schedulers other than none)
    def view(self, study: optuna.Study, trials: List[FrozenTrial], leases: Dict[int, Dict[str, Any]]) -> StudyView:
        """What the scheduler decides from: each trial's state (paused from its lease), values and unit."""
        s = self.settings
        out = []
        for t in trials:
            lease = leases.get(t.number) or {}
            state = _STATES.get(t.state, State.RUNNING)
            if state is State.RUNNING and lease.get("ended"):
                state = State.PRUNED  # being ended (its tell may not be in the trials read above)
            elif state is State.RUNNING and lease.get("paused"):
                state = State.PAUSED
            unit = Unit.from_fields(lease["unit"]) if isinstance(lease.get("unit"), dict) else None
            out.append(TrialView(t.number, state, dict(t.params), dict(t.intermediate_values), unit))
        return StudyView(out, budget(s), int(s.max_steps or 0), Direction.parse(s.direction))

    def _resume(self, study: optuna.Study, unit: Unit, leases: Dict[int, Dict[str, Any]]) -> "Assignment | Next":
        """Claim a paused trial's next unit (a promotion, a PBT interval): the next generation of its lease,
        so of two workers promoting it one wins, and a trial leaves a rung once."""
        assert unit.trial is not None
        lease = leases.get(unit.trial)
        if lease is None or not lease.get("paused"):
            return Next.WAIT
        gen = int(lease["gen"]) + 1
        if self._claim(unit.trial, gen, 0, unit=unit.fields()) is None:
            return Next.WAIT  # another worker took it first: look again
        t = study.get_trials(deepcopy=False)[unit.trial]
        params = dict(unit.params) or dict(t.params)
        return Assignment(t.number, optuna_compat.trial_id(t), params, unit.kind.value, 0, gen, None, unit,
                          dir_params=dict(t.params))

    def _end_stranded(self, study: optuna.Study, view: StudyView, leases: Dict[int, Dict[str, Any]]) -> None:
        """The study is done: every trial still paused ends pruned at the step it paused at (its lease
        first, so one worker ends it; then the study). ``self.ended`` tells the worker whose records to write."""
        assert self.scheduler is not None
        by = view.by_number()
        for number in self.scheduler.stranded(view):
            lease = leases.get(number)
            if lease is None or not lease.get("paused"):
                continue
            step = by[number].paused_at
            if self._claim(number, int(lease["gen"]) + 1, 0, unit=lease.get("unit"), step=step, ended=True) is None:
                continue
            self.end_hook(number, step, dict(by[number].params))  # the record first: a worker killed here
            tell(study, number, TrialState.PRUNED)  # leaves an ended lease, which the next look finishes

    def _claim(self, number: int, gen: int, adoptions: int, **extra: Any) -> Optional[Dict[str, Any]]:
        return claim(self.sweep_dir, number, gen, self.me, self.clock(), adoptions=adoptions,
                     **self.fields, **extra)

    @staticmethod
    def _assignment(t: FrozenTrial, how: str, adoptions: int, gen: int,
                    unit: Optional[Dict[str, Any]] = None) -> Assignment:
        return Assignment(t.number, optuna_compat.trial_id(t), dict(t.params), how, adoptions, gen,
                          unit=Unit.from_fields(unit) if isinstance(unit, dict) else None)

    def _fill_params(self, study: optuna.Study, a: Assignment) -> None:
        """The trial's parameters, sampled now (no lock held) for a new trial or one whose asker died
        before it sampled; a trial's stored parameters are kept."""
        missing = [p for p in self.settings.space.params if p.name not in a.params]
        if not missing:
            return
        trial = a.trial if a.trial is not None else optuna.Trial(study, a.trial_id)
        for p in missing:
            a.params[p.name] = suggest(trial, p.name, p.distribution())
        a.trial = None

    # ------------------------------------------------------------ the holder's side
    def holds(self, a: Assignment) -> bool:
        lease = read_lease(self.sweep_dir, a.number, self.claims)
        return lease is not None and lease.get("owner") == self.me and int(lease["gen"]) == a.gen \
            and not lease.get("released") and not _resting(lease)

    def beat(self, a: Assignment) -> None:
        touch(alive_path(self.sweep_dir, a.number, self.me), self.clock())

    def commit(self, study: optuna.Study, a: Assignment, state: TrialState, value: Optional[float] = None) -> bool:
        """Tell the study how the trial ended, if this worker still holds its lease (the generation it
        claimed); False when it lost the trial to another worker, or the trial was settled already."""
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return tell(study, a.number, state, value)

    def release(self, a: Assignment) -> bool:
        """Let the trial go unfinished (a time limit): the next worker resumes it, no adoption counted."""
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return self._claim(a.number, a.gen + 1, a.adoptions, released=True,
                               unit=a.unit.fields() if a.unit else None) is not None

    def pause(self, a: Assignment) -> bool:
        """The unit ran to its end before max_steps: the trial waits, paused, for the scheduler's next unit."""
        assert a.unit is not None
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return self._claim(a.number, a.gen + 1, 0, paused=True, step=a.unit.end_step,
                               unit=a.unit.fields()) is not None


def _resting(lease: Dict[str, Any]) -> bool:
    """Between units (paused) or ended: no owner runs it."""
    return bool(lease.get("paused") or lease.get("ended"))


_STATES = {TrialState.COMPLETE: State.COMPLETED, TrialState.PRUNED: State.PRUNED, TrialState.FAIL: State.FAILED}


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

        return pbt.scheduler(settings)  # type: ignore[attr-defined]
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


def next_trial(study: optuna.Study, settings: Settings, sweep_dir: "str | Path", me: str,
               owner_fields: Dict[str, Any]) -> "Assignment | Next":
    """This worker's next trial (:meth:`Leases.next_trial` with the real clock, squeue and processes)."""
    return Leases(sweep_dir, settings, me, owner_fields).next_trial(study)


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


def trial_rows(trials: List[FrozenTrial]) -> List[Dict[str, Any]]:
    return [{"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": dict(t.params)}
            for t in trials]
