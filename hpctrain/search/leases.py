"""Who runs which trial of a search: one worker's side of the claim protocol over the lease files
(:mod:`hpctrain.search.claims`).

A worker:

1. looks, under no lock: the owner of every running trial that is not beating (its
   ``<n>.<owner>.alive`` file, touched every ``heartbeat_s``) is asked about: one ``squeue`` for the
   Slurm jobs, a process check for local workers (:mod:`hpctrain.core.liveness`). A failed query is
   *unknown*, never gone;
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
runs. A unit that ends before ``max_steps`` leaves the trial paused: the next generation of its lease is
marked paused (its trial stays RUNNING in Optuna, its objective at the end step reported), and adoption
leaves it alone. In step 2, after the trials of gone owners, the scheduler picks from a view of the study
(:meth:`Leases.view`): a paused trial's next unit is claimed as the next generation of its lease (so of two
promoters one wins, and a trial leaves a rung once), a new trial as before. When the scheduler has nothing
left and no unit runs, every paused trial's lease is marked ended and the trial told pruned.
"""

import socket
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpctrain._compat import optuna as optuna_compat
from hpctrain.core import liveness
from hpctrain.core.liveness import Liveness
from hpctrain.core.state import Direction, State
from hpctrain.search.claims import Claims, Lease, Mark, alive_path, claim, heartbeat_age, read_lease, \
    read_leases, touch, trials_lock
from hpctrain.search.settings import Settings
from hpctrain.search.study import budget, build_scheduler, settle_failed, suggest, tell
from hpctrain.search.units import Next, StudyView, TrialView, Unit, UnitKind

QueueAnswer = Callable[[List[str]], Optional[Set[str]]]  # the job ids still in the queue; None: unknown
ProcessAnswer = Callable[[int, float], Liveness]  # (pid, a time it ran) -> its state


def slurm_queue(job_ids: List[str]) -> Optional[Set[str]]:
    """The jobs of ``job_ids`` still in Slurm's queue; None when squeue could not answer. The one squeue
    call of the protocol, asked of the batch script's host side inside a job (the worker may run in an image
    without Slurm): :func:`hpctrain.slurm.host.squeue`."""
    from hpctrain.slurm import host
    from hpctrain.slurm import parse as slurm_parse

    queue = host.squeue(job_ids)
    if queue is None:
        return None
    return {j for j in job_ids if slurm_parse.in_queue(queue, j)}


def process_state(pid: int, started_by: float) -> Liveness:
    """A local worker's process (:func:`hpctrain.core.liveness.process`): it ran when it claimed."""
    return liveness.process(pid, started_by=started_by)


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
    state: Liveness
    beating: bool = False  # its heartbeat was fresh: ALIVE by that alone, or GONE although fresh (asked anyway)


class Verdict(Enum):
    """What a worker may do with another's running trial, from its lease and what the look found."""

    LEAVE = "leave"  # its owner runs it (or it rests between units, or it is ours)
    LOOK_AGAIN = "look again"  # its owner's fate is unknown, or it changed hands since the look
    FINISH_ENDING = "finish ending"  # its ender died between the ended claim and the tell
    RESUME = "resume"  # released at a time limit: anyone resumes it, no adoption counted
    ADOPT = "adopt"  # its owner is known gone


_STATES = {TrialState.COMPLETE: State.COMPLETED, TrialState.PRUNED: State.PRUNED, TrialState.FAIL: State.FAILED}


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
        self.claims: Claims = {}  # claim files read so far (read_leases)
        # writes an ended trial's record (the worker's; quick file writes): called before the study is told
        self.end_hook: Callable[[int, Optional[int], Dict[str, Any]], None] = lambda *e: self.ended.append(e)

    # ------------------------------------------------------------ facts, outside the lock
    def _window(self) -> float:
        s = self.settings
        return min(s.grace_s, 3 * s.heartbeat_s)

    def _age(self, lease: Lease) -> float:
        return heartbeat_age(self.sweep_dir, lease.number, lease.owner, self.clock())

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
            if lease is None or lease.owner == self.me or lease.mark.resting:
                continue
            beating[number] = self._age(lease) < self._window()
            state = self._without_queue(lease, confirm)
            if state is None:
                ask[number] = str(lease.slurm_job_id)
            else:
                seen[number] = Seen(lease.gen, state, beating[number])
        if ask:
            in_queue = self.queue(sorted(set(ask.values())))
            for number, job in ask.items():
                if in_queue is None:
                    state = Liveness.UNKNOWN  # a failed query: unknown, never gone
                elif job in in_queue:
                    state = Liveness.ALIVE
                else:
                    self.gone_jobs.add(job)
                    state = Liveness.GONE
                seen[number] = Seen(leases[number].gen, state, beating[number])
        return seen

    def _without_queue(self, lease: Lease, confirm: bool = False) -> Optional[Liveness]:
        """The owner's state when the queue need not be asked; None: ask it."""
        if lease.mark is Mark.RELEASED:
            return Liveness.GONE  # let go at a time limit: resumable at once, no adoption counted
        if lease.local and self.process(int(lease.pid or 0), lease.since) is Liveness.GONE:
            return Liveness.GONE  # a dead process beats no more: no need to wait for its heartbeat to age
        age = self._age(lease)
        if age < self._window() and not (confirm and lease.slurm_job_id):
            return Liveness.ALIVE  # beating: alive, whatever the queue says
        if lease.slurm_job_id:
            return Liveness.GONE if lease.slurm_job_id in self.gone_jobs else None
        if lease.local:
            return self.process(int(lease.pid or 0), lease.since)
        # nobody can be asked about this owner: its heartbeat is all there is
        return Liveness.GONE if age > self.settings.grace_s else Liveness.UNKNOWN

    # ------------------------------------------------------------ the decision, under the lock
    def next_trial(self, study: optuna.Study) -> "Assignment | Next":
        """This worker's next trial, or why there is none now. Facts first (no lock), then the decision
        under :func:`trials_lock` (quick: files and the journal only), then the sampler (no lock)."""
        seen = self.look(study)
        with trials_lock(self.sweep_dir):
            got = self.decide(study, seen)
        if got is Next.DONE and any(f.beating and f.state is Liveness.ALIVE for f in seen.values()):
            # before the last free worker leaves, owners thought alive by their heartbeat alone are
            # asked about: one squeue at the end of the study, none per trial
            seen = self.look(study, confirm=True)
            with trials_lock(self.sweep_dir):
                got = self.decide(study, seen)
        if isinstance(got, Assignment):
            self._fill_params(study, got)
        return got

    def decide(self, study: optuna.Study, seen: Dict[int, Seen]) -> "Assignment | Next":
        """Its own trial back (a requeue), else a gone owner's, else the scheduler's next unit or a new trial."""
        trials = study.get_trials(deepcopy=False)
        leases = read_leases(self.sweep_dir, self.claims)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        mine = self._take_back(running, leases)
        if mine is not None:
            return mine
        adopted, undecided = self._adopt(study, running, leases, seen)
        if adopted is not None:
            return adopted
        return self._next_unit(study, trials, leases, undecided)

    def _take_back(self, running: List[FrozenTrial], leases: Dict[int, Lease]) -> Optional[Assignment]:
        """This worker's own trial from before a requeue: the next generation of its lease."""
        for t in running:
            lease = leases.get(t.number)
            if lease is not None and lease.owner == self.me and lease.mark is Mark.HELD:
                if self._claim(lease.number, lease.gen + 1, lease.adoptions, lease.unit) is not None:
                    return self._assignment(t, "resumed", lease.adoptions, lease.gen + 1, lease.unit)
        return None

    def _verdict(self, t: FrozenTrial, lease: Optional[Lease], seen: Dict[int, Seen]) -> Verdict:
        if lease is None:  # asked, then its asker died before its claim was read: by the trial's age
            started = t.datetime_start.timestamp() if t.datetime_start is not None else 0.0
            return Verdict.LOOK_AGAIN if self.clock() - started <= self.settings.grace_s else Verdict.ADOPT
        if lease.mark is Mark.PAUSED:
            return Verdict.LEAVE
        if lease.mark is Mark.ENDED:
            return Verdict.FINISH_ENDING
        if lease.mark is Mark.RELEASED:
            return Verdict.RESUME
        if lease.owner == self.me:
            return Verdict.LEAVE  # ours, and someone claimed it again first
        fact = seen.get(t.number)
        if fact is None or fact.gen != lease.gen or fact.state is Liveness.UNKNOWN:
            return Verdict.LOOK_AGAIN  # not looked at, or changed hands since: look again
        if fact.state is Liveness.ALIVE:
            return Verdict.LEAVE
        dead = fact.beating or (not lease.slurm_job_id and lease.host == socket.gethostname())
        if not dead and self._age(lease) < self._window():
            return Verdict.LEAVE  # it beat since we looked (a requeued job, running again)
        return Verdict.ADOPT

    def _adopt(self, study: optuna.Study, running: List[FrozenTrial], leases: Dict[int, Lease],
               seen: Dict[int, Seen]) -> Tuple[Optional[Assignment], bool]:
        """A released or gone owner's trial (the next generation of its lease); and whether some owner's
        fate was left undecided (then the study is not done)."""
        undecided = False
        for t in running:
            lease = leases.get(t.number)
            verdict = self._verdict(t, lease, seen)
            if verdict is Verdict.LOOK_AGAIN:
                undecided = True
            elif verdict is Verdict.FINISH_ENDING:
                assert lease is not None
                self.end_hook(t.number, lease.step, dict(t.params))
                tell(study, t.number, TrialState.PRUNED)
            elif verdict in (Verdict.RESUME, Verdict.ADOPT):
                adoptions = (lease.adoptions if lease else 0) + (verdict is Verdict.ADOPT)
                gen = (lease.gen if lease else 0) + 1
                unit = lease.unit if lease else None
                if self._claim(t.number, gen, adoptions, unit) is None:
                    continue  # another worker took it first
                if adoptions > self.settings.max_adoptions:
                    settle_failed(study, t, f"its worker died {adoptions - 1} time(s) while running it")
                    continue
                return self._assignment(t, "adopted", adoptions, gen, unit), undecided
        return None, undecided

    def _next_unit(self, study: optuna.Study, trials: List[FrozenTrial], leases: Dict[int, Lease],
                   undecided: bool) -> "Assignment | Next":
        """The scheduler's next unit (a promotion, a PBT interval) or a new trial while the budget lasts:
        its number claimed first, then Optuna asked (so the study never passes ``n_trials``)."""
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
        if number >= budget(self.settings):
            return Next.WAIT if undecided else Next.DONE
        lease = leases.get(number)  # the next number's claim: its claimant is asking now, or died asking
        if lease is not None and self.clock() - lease.since <= self.settings.grace_s:
            return Next.WAIT
        if self._claim(number, (lease.gen if lease else 0) + 1, 0, unit) is None:
            return Next.WAIT
        trial = study.ask()  # the sampler's per-parameter work waits for _fill_params, outside the lock
        gen = (lease.gen if lease else 0) + 1
        if trial.number != number:  # someone asked without claiming first (not hpctrain): claim what we got
            asked = read_lease(self.sweep_dir, trial.number, self.claims)
            gen = (asked.gen if asked else 0) + 1
            unit = unit.numbered(trial.number) if unit else None
            if self._claim(trial.number, gen, 0, unit) is None:
                return Next.WAIT
        return Assignment(trial.number, optuna_compat.trial_id(trial), {}, "new", 0, gen, trial, unit)

    # ------------------------------------------------------------ units (schedulers other than none)
    def view(self, study: optuna.Study, trials: List[FrozenTrial], leases: Dict[int, Lease]) -> StudyView:
        """What the scheduler decides from: each trial's state (paused from its lease), values and unit."""
        out = []
        for t in trials:
            lease = leases.get(t.number)
            mark = lease.mark if lease is not None else Mark.HELD
            state = _STATES.get(t.state, State.RUNNING)
            if state is State.RUNNING and mark is Mark.ENDED:
                state = State.PRUNED  # being ended (its tell may not be in the trials read above)
            elif state is State.RUNNING and mark is Mark.PAUSED:
                state = State.PAUSED
            out.append(TrialView(t.number, state, dict(t.params), dict(t.intermediate_values),
                                 lease.unit if lease is not None else None))
        s = self.settings
        return StudyView(out, budget(s), int(s.max_steps or 0), Direction.parse(s.direction))

    def _resume(self, study: optuna.Study, unit: Unit, leases: Dict[int, Lease]) -> "Assignment | Next":
        """Claim a paused trial's next unit (a promotion, a PBT interval): the next generation of its lease,
        so of two workers promoting it one wins, and a trial leaves a rung once."""
        assert unit.trial is not None
        lease = leases.get(unit.trial)
        if lease is None or lease.mark is not Mark.PAUSED:
            return Next.WAIT
        if self._claim(lease.number, lease.gen + 1, 0, unit) is None:
            return Next.WAIT  # another worker took it first: look again
        t = study.get_trials(deepcopy=False)[unit.trial]
        params = dict(unit.params) or dict(t.params)
        return Assignment(t.number, optuna_compat.trial_id(t), params, unit.kind.value, 0, lease.gen + 1, None,
                          unit, dir_params=dict(t.params))

    def _end_stranded(self, study: optuna.Study, view: StudyView, leases: Dict[int, Lease]) -> None:
        """The study is done: every trial still paused ends pruned at the step it paused at (its lease
        first, so one worker ends it; then the study). ``self.ended`` tells the worker whose records to write."""
        assert self.scheduler is not None
        by = view.by_number()
        for number in self.scheduler.stranded(view):
            lease = leases.get(number)
            if lease is None or lease.mark is not Mark.PAUSED:
                continue
            step = by[number].paused_at
            if self._claim(lease.number, lease.gen + 1, 0, lease.unit, mark=Mark.ENDED, step=step) is None:
                continue
            self.end_hook(number, step, dict(by[number].params))  # the record first: a worker killed here
            tell(study, number, TrialState.PRUNED)  # leaves an ended lease, which the next look finishes

    def _claim(self, number: int, gen: int, adoptions: int, unit: Optional[Unit], mark: Mark = Mark.HELD,
               step: Optional[int] = None) -> Optional[Lease]:
        """Generation ``gen`` of trial ``number``'s lease, for this worker."""
        return claim(self.sweep_dir, number, gen, self.me, self.clock(), adoptions=adoptions, unit=unit, mark=mark,
                     step=step, **self.fields)

    @staticmethod
    def _assignment(t: FrozenTrial, how: str, adoptions: int, gen: int, unit: Optional[Unit] = None) -> Assignment:
        return Assignment(t.number, optuna_compat.trial_id(t), dict(t.params), how, adoptions, gen, unit=unit)

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
        return lease is not None and lease.owner == self.me and lease.gen == a.gen and lease.mark is Mark.HELD

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
            return self._claim(a.number, a.gen + 1, a.adoptions, a.unit, mark=Mark.RELEASED) is not None

    def pause(self, a: Assignment) -> bool:
        """The unit ran to its end before max_steps: the trial waits, paused, for the scheduler's next unit."""
        assert a.unit is not None
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return self._claim(a.number, a.gen + 1, 0, a.unit, mark=Mark.PAUSED, step=a.unit.end_step) is not None

