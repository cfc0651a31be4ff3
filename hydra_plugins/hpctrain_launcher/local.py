"""``hydra/launcher=local``: the same jobs on this machine, through submitit's local executor.

submitit's local executor starts every job of an array at once; this launcher keeps at most
``max_parallel`` runs going, each pinned to its own GPUs, and waits for all of them.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, List

from hydra.core.utils import JobReturn

from hpctrain import compat

from .ended import attempt_ended
from .launcher import BaseLauncher, Run


def visible_gpus() -> List[int]:
    """GPU indices this process may use, found without importing torch."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return list(range(len([d for d in env.split(",") if d.strip()])))
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(range(sum(line.startswith("GPU ") for line in out.splitlines())))


class LocalLauncher(BaseLauncher):
    kind = "local"

    def gpus_per_node(self) -> int:
        if self.params.gpus_per_node is not None:
            return int(self.params.gpus_per_node)
        tasks = int(self.params.tasks_per_node or 1)
        return tasks if visible_gpus() else 0

    def max_parallel(self) -> int:
        if self.params.max_parallel:
            return int(self.params.max_parallel)
        per_run = self.gpus_per_node()
        return max(1, len(visible_gpus()) // per_run) if per_run else 1

    def check_resources(self) -> List[str]:
        problems = []
        gpus, per_run = visible_gpus(), self.gpus_per_node()
        if per_run > len(gpus):
            problems.append(f"hydra.launcher.gpus_per_node={per_run}: this machine has {len(gpus)} visible GPU(s)")
        if self.params.max_parallel is not None and int(self.params.max_parallel) < 1:
            problems.append(f"hydra.launcher.max_parallel={self.params.max_parallel}: expected an integer >= 1")
        return problems

    def submit(self, tasks: List[List[Run]], job: Any, python: str, sweep_dir: Path) -> List[Any]:
        import submitit

        executor = submitit.LocalExecutor(
            folder=str(self.params.submitit_folder), max_num_timeout=int(self.params.max_num_timeout), python=python
        )
        per_run, parallel = self.gpus_per_node(), self.max_parallel()
        executor.update_parameters(
            timeout_min=int(self.params.timeout_min),
            tasks_per_node=self.tasks_per_node(),
            gpus_per_node=per_run,
            signal_delay_s=int(self.params.signal_delay_s),
            setup=self.setup_lines(),
        )
        k = self.runs_per_task()
        what = f"{parallel} task(s) at a time, {k} runs side by side in each" if k > 1 else f"{parallel} at a time"
        print(f"hpctrain: {sum(map(len, tasks))} run(s) on this machine, {what}, "
              f"{self.tasks_per_node()} rank(s) each; sweep dir {sweep_dir}")
        free = [list(range(s * per_run, (s + 1) * per_run)) for s in range(parallel)]
        args = self.task_args(tasks, k > 1)
        pending, running, jobs = list(range(len(tasks))), {}, {}
        while pending or running:
            while pending and free:
                t, gpus = pending.pop(0), free.pop(0)
                executor.update_parameters(visible_gpus=tuple(gpus))
                jobs[t] = submitted = executor.submit(job, *[a[t] for a in args])
                running[t] = (submitted, gpus)
                self.record_job_ids(sweep_dir, {run.idx: str(submitted.job_id) for run in tasks[t]})
                names = ", ".join(f"#{run.idx} {run.name}" for run in tasks[t])
                print(f"  started {names} (job {submitted.job_id})", flush=True)
            for t, (submitted, gpus) in list(running.items()):
                if submitted.done():
                    del running[t]
                    free.append(gpus)
                    if self._ended(tasks[t], submitted):
                        pending.insert(0, t)  # retried: submitted again, first in line
            time.sleep(0.2)
        return [jobs[t] for t in range(len(tasks))]

    def _ended(self, task: List[Run], job: Any) -> bool:
        """Record a silent death and decide a retry (any rank's crash counts, any run of a pack: each
        decides for itself); True to submit the task again (its ended runs are not run again)."""
        code = compat.local_job_exit_code(job)
        print(f"  ended   {', '.join(f'#{run.idx}' for run in task)} (exit code {code})", flush=True)
        retries = [attempt_ended(run.run_dir, code if code is not None else -1, int(self.params.max_retries),
                                 str(job.paths.stderr)) for run in task]
        return any(r is not None for r in retries)

    def finish(self, runs: List[Run], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        return self.report_results(runs, [self._collect(run, job) for run, job in zip(runs, jobs)], sweep_dir)
