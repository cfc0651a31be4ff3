"""``hydra/sweeper=hpctrain``: Hydra's basic sweeper, less its up-front composition of every point.

BasicSweeper composes each point once before launching (about 70 ms a point: over a minute for 1000
points) only to find errors early. hpctrain's launchers check every point themselves, faster, before
submitting anything, so with them that pass is skipped; with any other launcher it still runs.
It also tells hpctrain's launcher the whole sweep before the first batch (``max_batch_size``), so that
run-dir names leave out the same constant keys in every batch.

The sweep's size is counted from its parsed overrides before any point is listed or composed (and before
Hydra writes multirun.yaml): ``seed=range(0,1000000)`` is refused in well under a second, not planned.
"""

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence

from hydra.core.override_parser.types import Override

from hpctrain._compat.hydra import BasicSweeper
from hpctrain.core.atomic import write_bytes_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.keys import count_values
from hpctrain.submit.launcher import BaseLauncher, implementation_of

MAX_POINTS = 100_000  # points one sweep may plan: 10x the largest benchmarked (benchmarks/README.md)


class HpctrainSweeper(BasicSweeper):
    def sweep(self, arguments: List[str]) -> Any:
        assert self.config is not None
        launcher = implementation_of(self.launcher)
        dry_run = launcher is not None and bool(launcher.params.dry_run)
        with scrubbed_on_refusal(Path(str(self.config.hydra.sweep.dir)), dry_run):
            return super().sweep(arguments)

    def split_arguments(self, overrides: List[Override], max_batch_size: Optional[int]) -> List[List[List[str]]]:  # type: ignore[override]
        """Hydra's expansion of the sweep into points (called before it writes multirun.yaml), once its size
        is known to fit."""
        problem = size_problem(overrides, implementation_of(self.launcher))
        if problem:
            raise LaunchError(f"nothing submitted: {problem}")
        return BasicSweeper.split_arguments(overrides, max_batch_size)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if implementation_of(self.launcher) is not None:
            return  # the launcher validates every point (plan.plan_runs and BaseLauncher.check)
        super().validate_batch_is_legal(batch)

    def get_job_batch(self) -> Sequence[Sequence[str]]:
        launcher = implementation_of(self.launcher)
        if launcher is not None and self.batch_index == 0 and self.overrides is not None:
            launcher.name_runs_by([point for batch in self.overrides for point in batch])
        return super().get_job_batch()


@contextmanager
def scrubbed_on_refusal(sweep_dir: Path, dry_run: bool = False) -> Iterator[None]:
    """Hydra's sweeper writes multirun.yaml (and makes the sweep dir) before the launcher checks the points:
    when the launcher refuses them, or after a dry run, what it wrote goes again (a rerun's earlier
    multirun.yaml comes back), so that ``status``, ``report`` and ``tensorboard`` keep defaulting to the last
    real sweep. Any other error in a sweep dir made here that holds nothing else takes it away too."""
    absent = sweep_dir.absolute()
    while not absent.parent.exists() and absent.parent != absent:
        absent = absent.parent
    made = None if absent.exists() else absent  # the top dir the sweeper makes
    multirun = SweepPaths(sweep_dir).multirun_yaml
    try:
        before: Optional[bytes] = multirun.read_bytes()
    except OSError:
        before = None
    try:
        yield
    except LaunchError as exc:
        if str(exc).startswith("nothing submitted"):
            _scrub(multirun, before, made)
        raise
    except Exception:
        if made is not None and _holds_only(multirun):
            _scrub(multirun, None, made)
        raise
    if dry_run:
        _scrub(multirun, before, made)


def _holds_only(multirun: Path) -> bool:
    """Whether the sweep dir holds multirun.yaml alone (nothing was planned, staged or submitted in it)."""
    try:
        return [p.name for p in multirun.parent.iterdir()] in ([multirun.name], [])
    except OSError:
        return False


def _scrub(multirun: Path, before: Optional[bytes], made: Optional[Path]) -> None:
    try:
        if before is not None:
            write_bytes_atomic(multirun, before)
        else:
            multirun.unlink(missing_ok=True)
            folder = multirun.parent
            while made is not None and folder != made.parent and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
    except OSError:
        pass  # scrubbing is a courtesy: the refusal itself is what the user must see


def size_problem(overrides: Sequence[Override], launcher: Optional[BaseLauncher]) -> Optional[str]:
    """One line when the sweep has more points than hpctrain plans at once, else None (more tasks than the
    queue holds are pulled by workers: :meth:`BaseLauncher.pull_workers`)."""
    sizes = {o.get_key_element(): count_values(o, MAX_POINTS + 1) for o in overrides}  # a key given twice: the last one counts
    points = math.prod(sizes.values())
    swept = " x ".join(f"{key}: {n}" for key, n in sizes.items() if n != 1)
    if points > MAX_POINTS:
        return (f"the sweep has {points} points ({swept}); hpctrain plans at most {MAX_POINTS} in one sweep: "
                f"split it, or search the space (hydra/sweeper=search)")
    return None
