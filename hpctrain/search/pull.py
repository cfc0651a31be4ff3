"""A pull worker: one task of a grid sweep's array, running points until none is left (``hydra.launcher.workers``,
or the queue cap: :mod:`hpctrain.submit.launcher`).

Each point is claimed through :class:`hpctrain.search.points.PointLeases` and run as an array task would run it,
by :class:`hpctrain.job.wrapper.SweepJob` (its run dir named by its values, its record, a completed point
never run again); the worker beats the point's alive file while it runs. A point that fails is retried here
within ``max_retries`` (``retrying`` in its record, as the job script's teardown decides for an array task).
It is a submitit checkpointable: on preemption the point's run is recorded ``requeued``, the task is
requeued, and the worker takes the point back first when it starts again (the app resumes its checkpoint).
At the end it writes what it measured (``.hpctrain/workers/pull-<job>.json``: its wall time, the time in
points, each claim's latency) for ``benchmarks/pull_grid.py``.
"""

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import submitit

from hpctrain._compat.submitit import private_pickles
from hpctrain.core import events
from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.run import RunSpec
from hpctrain.core.state import FINAL, State
from hpctrain.job import lifecycle
from hpctrain.job.attempt_ended import ended_or_said
from hpctrain.search.points import Point, PointLeases, PullSettings
from hpctrain.job.wrapper import SweepJob
from hpctrain.search.claims import ClaimsDir, Heartbeat, alive_path
from hpctrain.search.compose import Composer
from hpctrain.search.units import Next

private_pickles()  # the result pickle this job writes (the launcher reads it) not writable by the group

WAIT_S = 5.0  # between looks while an owner's fate is unknown
WAIT_MAX_GRACES = 5  # a worker waits for unknown owners at most this many grace periods
_running: Dict[str, Any] = {}  # this process's current point (its run spec), for checkpoint()


def points_of(runs_file: "str | Path") -> "tuple[Path, List[RunSpec]]":
    """The sweep dir and the points of a pulled submission's run list (``Submission.runs_json``)."""
    data = json.loads(Path(runs_file).read_text())
    sweep_dir = Path(data["sweep_dir"])
    return sweep_dir, [RunSpec.from_json(p, sweep_dir) for p in data["points"]]


class PullJob:
    def __init__(self, payload: str, sweep_dir: str, app: str, runs_file: str, claims_dir: str, workers: int,
                 settings: PullSettings) -> None:
        self.job = SweepJob(payload, sweep_dir, app)
        self.sweep_dir, self.runs_file, self.claims_dir = sweep_dir, runs_file, claims_dir
        self.workers, self.settings = workers, settings

    def __call__(self, worker: int) -> Dict[str, Any]:
        began = time.time()
        env = submitit.JobEnvironment()
        me = str(env.job_id)
        _, points = points_of(self.runs_file)
        payload = self.job.loaded()
        # each point's config as the search's workers compose a unit's (search/compose.py: the same config)
        self.job.compose = Composer(payload.hydra_context.config_loader, payload.config)
        owner = {"slurm_job_id": me if os.environ.get("SLURM_JOB_ID") else None, "worker": worker}
        leases = PointLeases(ClaimsDir(self.claims_dir), self.settings, me, owner, len(points), worker, self.workers)
        latencies: List[float] = []
        in_points, ran, waited = 0.0, 0, 0.0
        while True:
            asked = time.time()
            got = leases.next_point()
            got_at = time.time()
            if got is Next.WAIT and waited < WAIT_MAX_GRACES * self.settings.grace_s:
                time.sleep(WAIT_S)  # an owner's fate is unknown (the queue did not answer): look again
                waited += WAIT_S
                continue
            if not isinstance(got, Point):
                break
            waited = 0.0
            latencies.append(got_at - asked)
            self._run(points[got.number], got, leases)
            in_points += time.time() - got_at
            ran += 1
        stats = {"worker": worker, "job_id": me, "wall_s": time.time() - began, "in_points_s": in_points,
                 "points": ran, "claim_s": latencies}
        write_json_atomic(SweepPaths(self.sweep_dir).workers / f"pull-{me.replace('/', '_')}.json", stats)
        print(f"hpctrain pull: worker {worker} ({me}): no point left; ran {ran}", flush=True)
        return {"worker": worker, "points": ran}

    def _run(self, spec: RunSpec, p: Point, leases: PointLeases) -> None:
        """One point, retried within ``max_retries``; a point whose workers died too often ends failed."""
        run = spec.to_json(Path(self.sweep_dir))
        beat = Heartbeat(alive_path(ClaimsDir(self.claims_dir), p.number, leases.me), self.settings.heartbeat_s)
        _running["run"] = run
        try:
            self._attempts(spec, run, p)
        finally:
            _running.pop("run", None)
            beat.stop()
        leases.done(p)  # not on the way out of a requeue (SystemExit): the worker takes the point back

    def _attempts(self, spec: RunSpec, run: Dict[str, Any], p: Point) -> None:
        if events.read(spec.run_dir).state in FINAL - {State.FAILED}:
            return  # ended for good (cancelled, or completed by a worker that died before letting it go)
        if p.how == "adopted" and p.adoptions > self.settings.max_adoptions and not events.is_completed(spec.run_dir):
            events.failed(spec.run_dir, f"its worker died {p.adoptions - 1} time(s) while running it")
            return
        while True:
            try:
                self.job(run)
            except Exception:  # noqa: BLE001 - recorded in the point's record by its lifecycle
                pass
            if events.read(spec.run_dir).state is not State.FAILED:
                return
            if ended_or_said(spec.run_dir, 1, self.settings.max_retries) is None:
                return  # retries used up, or an error that would come back on every attempt

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on USR2: the point's run is recorded requeued and the task requeued; the worker
        takes the point back when it starts again."""
        run: Optional[Dict[str, Any]] = _running.get("run")
        if run is not None:
            lifecycle.requeue(RunSpec.from_json(run, Path(self.sweep_dir)).run_dir)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
