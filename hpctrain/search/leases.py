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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpctrain._compat import optuna as optuna_compat
from hpctrain.core.liveness import Liveness
from hpctrain.core.state import Direction, State
from hpctrain.search.claims import Lease, Mark, read_lease, read_leases, trials_lock
from hpctrain.search.holders import Holders, ProcessAnswer, QueueAnswer, Seen, Verdict, process_state, slurm_queue
from hpctrain.search.settings import Settings
from hpctrain.search.study import budget, build_scheduler, settle_failed, suggest, tell
from hpctrain.search.units import Next, StudyView, TrialView, Unit, UnitKind

__all__ = ["Assignment", "Leases", "Seen", "Verdict", "process_state", "slurm_queue"]


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


_STATES = {TrialState.COMPLETE: State.COMPLETED, TrialState.PRUNED: State.PRUNED, TrialState.FAIL: State.FAILED}


class Leases(Holders):
    """One worker's side of the claim protocol over a study (see the module docstring). ``clock``, ``queue``
    and ``process`` are what the tests replace: no real sleeping, no real squeue."""

    def __init__(self, sweep_dir: "str | Path", settings: Settings, me: str, fields: Dict[str, Any],
                 clock: Callable[[], float] = time.time, queue: QueueAnswer = slurm_queue,
                 process: ProcessAnswer = process_state) -> None:
        super().__init__(sweep_dir, settings, me, fields, clock, queue, process)
        self.settings: Settings = settings
        self.scheduler = build_scheduler(settings)
        self.ended: List[Any] = []  # (number, step, params) of paused trials this worker ended pruned
        # writes an ended trial's record (the worker's; quick file writes): called before the study is told
        self.end_hook: Callable[[int, Optional[int], Dict[str, Any]], None] = lambda *e: self.ended.append(e)

    # ------------------------------------------------------------ facts, outside the lock
    def look(self, study: optuna.Study, confirm: bool = False) -> Dict[int, Seen]:
        """The state of the owner of every running trial that is not this worker's (:meth:`Holders.look_at`)."""
        running = [t.number for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        return self.look_at(running, read_leases(self.sweep_dir, self.claims), confirm)

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
        return self.owner_verdict(lease, seen.get(t.number))

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
    def commit(self, study: optuna.Study, a: Assignment, state: TrialState, value: Optional[float] = None) -> bool:
        """Tell the study how the trial ended, if this worker still holds its lease (the generation it
        claimed); False when it lost the trial to another worker, or the trial was settled already."""
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return tell(study, a.number, state, value)

    def pause(self, a: Assignment) -> bool:
        """The unit ran to its end before max_steps: the trial waits, paused, for the scheduler's next unit."""
        assert a.unit is not None
        with trials_lock(self.sweep_dir):
            if not self.holds(a):
                return False
            return self._claim(a.number, a.gen + 1, 0, a.unit, mark=Mark.PAUSED, step=a.unit.end_step) is not None

