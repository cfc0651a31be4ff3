"""``hydra/sweeper=hpctrain``: Hydra's basic sweeper, less its up-front composition of every point.

BasicSweeper composes each point once before launching (about 70 ms a point: over a minute for 1000
points) only to find errors early. hpctrain's launchers check every point themselves, faster, before
submitting anything, so with them that pass is skipped; with any other launcher it still runs.
"""

from typing import Sequence

from hpctrain._compat.hydra import BasicSweeper
from hpctrain.launch.launcher import implementation_of


class HpctrainSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if implementation_of(self.launcher) is not None:
            return  # the launcher validates every point (plan.plan_runs and BaseLauncher.check)
        super().validate_batch_is_legal(batch)
