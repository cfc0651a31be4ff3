"""``hydra/launcher=local``: the same jobs on this machine, through submitit's local executor.

submitit's local executor starts every job of an array at once; this launcher keeps at most
``max_parallel`` runs going, each pinned to its own GPUs, and waits for all of them. Ctrl-C or SIGTERM
cancels them (checkpointed first) in one line: :mod:`hpctrain.submit.interrupt`.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hydra.core.utils import JobReturn

from hpctrain._compat.submitit import local_job_exit_code
from hpctrain.job.attempt_ended import ended_or_said as attempt_ended
from hpctrain.core import launcher_id
from hpctrain.core.run import RunSpec
from hpctrain.submit import interrupt, results
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.launcher import BaseLauncher, JobIds, PlannedRun
from hpctrain.submit.progress import Progress, trials_of
from hpctrain.submit.submission import Array, Calling, Submission


def visible_gpus(env: Optional[Mapping[str, str]] = None) -> List[int]:
    """Physical indices of the GPUs this process may use, found without importing torch.

    A parent ``CUDA_VISIBLE_DEVICES=2,3`` gives [2, 3]: submitit exports a run's ``visible_gpus`` as the
    run's own CUDA_VISIBLE_DEVICES, which counts from the machine's first GPU, not from the parent's list.
    """
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        ids = [d.strip() for d in value.split(",") if d.strip()]
        if not all(d.isdigit() for d in ids):
            raise LaunchError(f"CUDA_VISIBLE_DEVICES={value}: the local launcher pins runs to GPUs by index; "
                              f"expected integer indices (not UUIDs or MIG names)")
        return [int(d) for d in ids]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(range(sum(line.startswith("GPU ") for line in out.splitlines())))


def gpu_slots(gpus: Sequence[int], per_run: int, parallel: int) -> List[List[int]]:
    """Disjoint GPU sets, one per run going at once; never an index past the end of ``gpus``."""
    if per_run == 0:
        return [[] for _ in range(parallel)]
    return [list(gpus[s * per_run:(s + 1) * per_run]) for s in range(min(parallel, len(gpus) // per_run))]


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
        parallel = self.params.max_parallel
        if parallel is not None and int(parallel) < 1:
            problems.append(f"hydra.launcher.max_parallel={parallel}: expected an integer >= 1")
        elif parallel is not None and per_run and int(parallel) * per_run > len(gpus):
            problems.append(f"hydra.launcher.max_parallel={parallel}: {parallel} runs x gpus_per_node={per_run} need "
                            f"{int(parallel) * per_run} GPUs; this machine has {len(gpus)} visible "
                            f"({','.join(map(str, gpus)) or 'none'})")
        return problems

    def plan_arrays(self, submission: Submission) -> List[Array]:
        """All tasks as one batch of local jobs (no script: submitit's local executor runs the command)."""
        per_run, parallel = self.gpus_per_node(), self.parallel(submission)
        params = dict(timeout_min=int(self.params.timeout_min), tasks_per_node=self.tasks_per_node(),
                      gpus_per_node=per_run, signal_delay_s=int(self.params.signal_delay_s),
                      setup=self.setup_lines() + self.thread_lines(per_run, min(parallel, len(submission.tasks))))
        return [Array(0, len(submission.tasks), params)]

    def parallel(self, submission: Submission) -> int:
        """Tasks at once: ``max_parallel``; a grid's pull workers all at once (each its own GPUs)."""
        return len(submission.tasks) if submission.calling is Calling.PULL else self.max_parallel()

    def resources(self) -> Dict[str, Any]:
        return dict(super().resources(), max_parallel=self.max_parallel())

    def send(self, submission: Submission, job: Any, job_ids: JobIds) -> List[Any]:
        """At most ``max_parallel`` tasks at once, each on its own GPUs; a failed task is retried here."""
        import submitit

        launcher_id.record(submission.sweep_dir)  # `cancel` signals this process only while it is still it
        executor = submitit.LocalExecutor(python=submission.python, **submission.executor)
        (array,) = submission.arrays
        executor.update_parameters(**array.parameters)
        tasks = submission.tasks
        per_run, parallel = self.gpus_per_node(), self.parallel(submission)
        k = self.runs_per_task()
        what = f"{parallel} task(s) at a time, {k} runs side by side in each" if k > 1 else f"{parallel} at a time"
        if submission.calling is Calling.PULL:
            what = f"pulled by {len(tasks)} worker(s)"
        print(f"hpctrain: {len(submission.runs)} run(s) on this machine, {what}, "
              f"{self.tasks_per_node()} rank(s) each; sweep dir {submission.sweep_dir}")
        free = gpu_slots(visible_gpus(), per_run, parallel)  # physical indices, disjoint
        args = submission.args()
        pending = list(range(len(tasks)))
        running: Dict[int, Tuple[Any, List[int]]] = {}
        jobs: Dict[int, Any] = {}
        task_of = {run.idx: t for t, task in enumerate(tasks) for run in task}
        if submission.calling is Calling.POSITIONAL:  # a search's workers: the display follows their trials
            progress = Progress([], discover=lambda: trials_of(submission.sweep_dir))
        elif submission.calling is Calling.PULL:  # a grid's workers: its points, worked while any worker runs
            progress = Progress(submission.points, alive=lambda idx: bool(running))
        else:
            progress = Progress(submission.runs, alive=lambda idx: task_of[idx] in running)
        with interrupt.Interrupts() as interrupts:
            while pending or running:
                while pending and free and not interrupts.signals:
                    t, gpus = pending.pop(0), free.pop(0)
                    executor.update_parameters(visible_gpus=tuple(gpus))
                    with interrupt.deaf_children():  # a terminal's Ctrl-C is the launcher's to handle
                        jobs[t] = submitted = executor.submit(job, *[a[t] for a in args])
                    running[t] = (submitted, gpus)
                    job_ids({run.idx: str(submitted.job_id) for run in tasks[t]})
                if interrupts.signals:
                    progress.clear()
                    active = [run for t in [*running, *pending] for run in tasks[t]]
                    interrupt.cancel(interrupts, [j for j, _ in running.values()], active, submission.sweep_dir,
                                     search=submission.calling is Calling.POSITIONAL)
                for t, (submitted, gpus) in list(running.items()):
                    if submitted.done():
                        del running[t]
                        free.append(gpus)
                        if self._ended(tasks[t], submitted):
                            pending.insert(0, t)  # retried: submitted again, first in line
                progress.update()
                time.sleep(0.2)
        progress.close()
        return [jobs[t] for t in range(len(tasks))]

    def thread_lines(self, gpus_per_run: int, tasks_at_once: int) -> List[str]:
        """CPU runs side by side share this machine's cores: each rank gets its share as OMP_NUM_THREADS
        (torch's default, every core for every process, makes parallel CPU runs fight over them).
        Left alone when the user set OMP_NUM_THREADS, or the runs have GPUs."""
        if "OMP_NUM_THREADS" in os.environ or gpus_per_run:
            return []
        ranks = tasks_at_once * self.tasks_per_node() * self.runs_per_task()
        return [f"export OMP_NUM_THREADS={max(1, len(os.sched_getaffinity(0)) // max(1, ranks))}"]

    def _ended(self, task: Sequence[RunSpec], job: Any) -> bool:
        """Record a silent death and decide a retry (any rank's crash counts, any run of a pack: each
        decides for itself); True to submit the task again (its ended runs are not run again)."""
        code = local_job_exit_code(job)  # the record says how it ended: the progress display reads it there
        retries = [attempt_ended(run.run_dir, code if code is not None else -1, int(self.params.max_retries),
                                 str(job.paths.stderr)) for run in task]
        return any(r is not None for r in retries)

    def finish(self, runs: List[PlannedRun], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        return results.report(runs, [self.returns().collect(run, job) for run, job in zip(runs, jobs)], sweep_dir)
