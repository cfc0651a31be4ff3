"""``hydra/sweeper=hpctrain``: Hydra's basic sweeper, less its up-front composition of every point.

BasicSweeper composes each point once before launching (about 70 ms a point: over a minute for 1000
points) only to find errors early. hpctrain's launchers check every point themselves, faster, before
submitting anything, so with them that pass is skipped; with any other launcher it still runs.
It also tells hpctrain's launcher the whole sweep before the first batch (``max_batch_size``), so that
run-dir names leave out the same constant keys in every batch.
"""

from typing import Sequence

from hpctrain._compat.hydra import BasicSweeper
from hpctrain.submit.launcher import implementation_of


class HpctrainSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if implementation_of(self.launcher) is not None:
            return  # the launcher validates every point (plan.plan_runs and BaseLauncher.check)
        super().validate_batch_is_legal(batch)

    def get_job_batch(self) -> Sequence[Sequence[str]]:
        launcher = implementation_of(self.launcher)
        if launcher is not None and self.batch_index == 0 and self.overrides is not None:
            launcher.name_runs_by([point for batch in self.overrides for point in batch])
        return super().get_job_batch()
