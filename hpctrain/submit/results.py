"""What a launch returns to Hydra and prints: a JobReturn per run, the summary lines, the counts."""

from pathlib import Path
from typing import Any, List, Optional

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from hpctrain.core import events
from hpctrain.core import paths as runfiles
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.plan import PlannedRun
from hpctrain.submit.progress import objective_text, swept_labels


class Returns:
    """Makes the JobReturns of one launch (``task_name`` read once: 10,000 placeholders in a sweep)."""

    def __init__(self, task_name: Optional[str], packed: bool) -> None:
        self.task_name = task_name
        self.packed = packed

    def placeholder(self, run: PlannedRun, status: JobStatus) -> JobReturn:
        """A JobReturn for a run whose job gave none (skipped, dry run, not waited for, died)."""
        ret = _PlanReturn(overrides=run.overrides, status=status, task_name=self.task_name)
        ret.run = run
        ret.working_dir = str(run.run_dir)
        return ret

    def failed(self, run: PlannedRun, error: BaseException) -> JobReturn:
        ret = self.placeholder(run, JobStatus.FAILED)
        ret.return_value = error
        return ret

    def collect(self, run: PlannedRun, job: Any) -> JobReturn:
        """Rank 0's JobReturn as Hydra's ``run_job`` made it (cfg, hydra_cfg, task_name, working_dir, the
        return value), or the job's exception as a failed JobReturn."""
        if self.packed:  # a packed task returns no JobReturn per run: its record says
            status = JobStatus.COMPLETED if events.is_completed(run.run_dir) else JobStatus.FAILED
            ret = self.placeholder(run, status)
            summary = runfiles.read_metrics(run.run_dir) or {}
            ret.return_value = summary.get("metrics") if status == JobStatus.COMPLETED else RuntimeError(
                str(summary.get("error") or f"run {run.idx} ended {events.state_of(run.run_dir)}"))
            return ret
        try:
            ret = job.results()[0]
        except Exception as exc:  # noqa: BLE001 - a failed run is reported, the sweep goes on
            return self.failed(run, exc)
        if not isinstance(ret, JobReturn):  # a job of an older payload returned the bare value
            value, ret = ret, self.placeholder(run, JobStatus.COMPLETED)
            ret.return_value = value
        return ret


class _PlanReturn(JobReturn):
    """A JobReturn whose ``cfg`` (the point's config) is built only when read: 10,000 placeholders of an
    unwaited sweep would otherwise cost a config copy each."""

    run: Optional[PlannedRun] = None

    @property
    def cfg(self) -> Optional[DictConfig]:
        return self.run.cfg if self.run is not None else None

    @cfg.setter
    def cfg(self, value: Optional[DictConfig]) -> None:
        pass  # always the run's own


def report(runs: List[PlannedRun], returns: List[JobReturn], sweep_dir: Path) -> List[JobReturn]:
    """One line per ended run, the counts, and a non-zero exit (LaunchError) when a run failed."""
    print(f"sweep {sweep_dir}:")
    print("\n".join(summary_lines(runs)))
    failed = sum(r.status == JobStatus.FAILED for r in returns)
    print(f"{len(runs) - failed} completed, {failed} failed.  Next: python -m hpctrain report {sweep_dir}")
    if failed:
        raise LaunchError(f"{failed} of {len(runs)} run(s) failed: their metrics.json hold the errors")
    return returns


def summary_lines(runs: List[PlannedRun]) -> List[str]:
    """One short line per run: its swept values, its state, its objective (else the first metric it
    returned, a foreign app's own): ``#0   lr=0.001  completed  val/loss=0.4132``."""
    labels = swept_labels([run.overrides for run in runs])
    width = min(40, max((len(label) for label in labels), default=0))
    lines = []
    for run, label in zip(runs, labels):
        shown = objective_text(runfiles.read_metrics(run.run_dir) or {})
        state = events.state_of(run.run_dir) or "unknown"
        lines.append(f"  #{run.idx:<3} {label:<{width}}  {state!s:<9}  {shown}".rstrip())
    return lines


def print_next_commands(sweep_dir: Path) -> None:
    """After a submission that returns at once: where the sweep is and how to follow it."""
    import shlex

    print(f"  sweep dir: {sweep_dir}")
    for verb in ("status", "report", "tensorboard", "cancel"):
        print(f"  python -m hpctrain {verb} {shlex.quote(str(sweep_dir))}")
