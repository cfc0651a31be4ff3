"""``hydra/sweeper=hpctrain``: Hydra's basic sweeper, less its up-front composition of every point.

BasicSweeper composes each point once before launching (about 70 ms a point: over a minute for 1000
points) only to find errors early. hpctrain's launchers check every point themselves, faster, before
submitting anything, so with them that pass is skipped; with any other launcher it still runs.
It also tells hpctrain's launcher the whole sweep before the first batch (``max_batch_size``), so that
run-dir names leave out the same constant keys in every batch.

The sweep's size is counted from its parsed overrides before any point is listed or composed (and before
Hydra writes multirun.yaml): ``seed=range(0,1000000)`` is refused in well under a second, not planned.
"""

import decimal
import itertools
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence

from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep

from hpctrain._compat.hydra import BasicSweeper
from hpctrain.core.atomic import write_bytes_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.launcher import BaseLauncher, implementation_of

MAX_POINTS = 100_000  # points one sweep may plan: 10x the largest benchmarked (benchmarks/README.md)


class HpctrainSweeper(BasicSweeper):
    def sweep(self, arguments: List[str]) -> Any:
        assert self.config is not None
        with scrubbed_on_refusal(Path(str(self.config.hydra.sweep.dir))):
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
def scrubbed_on_refusal(sweep_dir: Path) -> Iterator[None]:
    """Hydra's sweeper writes multirun.yaml (and makes the sweep dir) before the launcher checks the points:
    when the launcher refuses them, what it wrote goes again (a rerun's earlier multirun.yaml comes back)."""
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
    sizes = {o.get_key_element(): count_values(o) for o in overrides}  # a key given twice: the last one counts
    points = math.prod(sizes.values())
    swept = " x ".join(f"{key}: {n}" for key, n in sizes.items() if n != 1)
    if points > MAX_POINTS:
        return (f"the sweep has {points} points ({swept}); hpctrain plans at most {MAX_POINTS} in one sweep: "
                f"split it, or search the space (hydra/sweeper=search)")
    return None


def count_values(o: Override) -> int:
    """How many values a sweep override lists (1 for a plain value), without listing a range."""
    if not o.is_sweep_override():
        return 1
    value = o.value()
    if isinstance(value, ChoiceSweep):
        return len(value.list)
    if isinstance(value, RangeSweep) and value.start is not None and value.stop is not None:
        if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
            return len(range(int(value.start), int(value.stop), int(value.step)))
        start, stop, step = (decimal.Decimal(v) for v in (value.start, value.stop, value.step))
        return max(0, math.ceil((stop - start) / step)) if step else 0
    if not o.is_discrete_sweep():
        return 1  # an interval: BasicSweeper refuses it with its own message
    return sum(1 for _ in itertools.islice(o.sweep_iterator(), MAX_POINTS + 1))
