"""``hydra/launcher=slurm``: the whole sweep as one Slurm job array (several past the cluster's limits).

submitit writes the sbatch script; this launcher maps hpctrain's resource names onto submitit's
sbatch parameters (a table, as submitit's own executors do), checks them against what the cluster
has, submits with ``map_array`` and returns (or waits with ``wait=true``).

A sweep of more tasks than one array may hold (``MaxArraySize`` / ``max_array_tasks``, see
:mod:`arrays`) is several arrays, each indexed from 0, chained with ``--dependency=afterany``: an
array starts once the one before it has ended, so ``array_parallelism`` holds for the whole sweep.

An array queued by a command killed between its ``sbatch`` and the write of its job ids is in no
sweep.json; before the same sweep is submitted again, such arrays are found in the queue by the script
submitit left behind and cancelled (:meth:`SlurmLauncher.cancel_orphans`): else they would train the runs
submitted again alongside their new jobs.
"""

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hpctrain._compat.submitit import convert_mem, pickles_of_one_mode, sbatch_script, unsent_scripts
from hpctrain.submit import arrays, results
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.launcher import BaseLauncher, JobIds, PlannedRun
from hpctrain.submit.progress import Progress
from hpctrain.submit.results import print_next_commands
from hpctrain.submit.submission import Array, Submission
from hpctrain.core.paths import HOST_DIR
from hpctrain.slurm import parse as slurm_parse
from hpctrain.slurm.ahead import Ahead
from hpctrain.slurm.host import HOST_DIR_ENV
from hpctrain.slurm import query as slurm

# hpctrain/submitit generic name -> submitit SlurmExecutor (sbatch) parameter
SBATCH_NAMES = {
    "timeout_min": "time",
    "tasks_per_node": "ntasks_per_node",
    "mem_gb": "mem",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "nodes": "nodes",
    "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task",
    "constraint": "constraint",
    "exclude": "exclude",
    "signal_delay_s": "signal_delay_s",
    "array_parallelism": "array_parallelism",
    "job_name": "job_name",
    "additional_parameters": "additional_parameters",
    "srun_args": "srun_args",
}

# sbatch options (additional_parameters, dashes or underscores) that give the job GPUs by count
GPU_OPTIONS = ("gpus", "gpus_per_node", "gpus_per_task", "gpus_per_socket")

# `scancel --signal=USR2 --full` also reaches the batch shell, whose default action is to die; a
# trap keeps it alive so that submitit's requeue from the job step completes.
USR2_TRAP = "trap 'echo hpctrain: batch shell got USR2, the job step checkpoints and requeues' USR2"

# The job's Slurm calls, made here on the host (hpctrain.slurm.host): the job step may run in an image with no
# Slurm client. A loop beside srun answers each request file of its host dir every 0.5 s; TERM and USR2 ignored
# (a subshell keeps none of the batch shell's traps), so that it answers through a preemption's grace time, a
# requeue's own SIGTERM and `scancel --signal=USR2 --full`; it ends with the batch shell (its dir, a heartbeat
# file, is emptied when the job starts again).
# Slurm's requeue, a cancel and the time limit SIGTERM the batch shell too: it lives on (the trap runs once srun
# has ended) so that its helper can still answer the job step; the teardown is skipped then, as when it died.
TERM_TRAP = "trap 'hpctrain_term=1; echo hpctrain: batch shell got TERM: the job ends or Slurm requeued it' TERM"
HOST_ANSWER = (
    "hpctrain_answer() { case \"$1\" in show) scontrol show job -o \"$hpctrain_job\";; "
    "requeue) scontrol requeue \"$hpctrain_job\";; "
    # the partition's usable nodes, before a hang's exclusion (hpctrain.slurm.exclusion)
    "nodes) sinfo -h -N -p \"$SLURM_JOB_PARTITION\" -o '%N|%T';; "
    # a retry away from the nodes a hang was seen on: a running job's ExcNodeList cannot be changed, a held one's can
    "\"exclude \"?*) case \"${1#exclude }\" in *[!A-Za-z0-9,._-]*) echo \"bad node names\"; return 2;; esac; "
    "scontrol requeuehold \"$hpctrain_job\" || return $?; "
    "scontrol update jobid=\"$hpctrain_job\" ExcNodeList=\"${1#exclude }\" || echo \"hpctrain-exclude-failed\"; "
    "scontrol release \"$hpctrain_job\";; "
    "\"squeue \"[0-9]*) case \"${1#squeue }\" in *[!0-9,]*) echo \"bad job ids\"; return 2;; esac; "
    "squeue -h -r -j \"${1#squeue }\" -o '%i|%T|%r';; "
    "*) echo \"unknown request: $1\"; return 2;; esac; }"
)
# The task's own id for scontrol: an array's task whose SLURM_JOB_ID is the array's (the one that holds the array's
# record) would otherwise requeue, hold or show every task of the array
OWN_JOB = 'hpctrain_job="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"; hpctrain_job="${hpctrain_job:-$SLURM_JOB_ID}"'
HOST_LOOP = (
    "(trap '' TERM USR2; while kill -0 $$ 2>/dev/null; do touch \"$hpctrain_host/alive\"; "
    "for q in \"$hpctrain_host\"/*.ask; do [ -e \"$q\" ] || continue; "
    "r=$(head -c 400 \"$q\"); rm -f \"$q\"; { hpctrain_answer \"$r\" 2>&1; echo \"rc=$?\"; } >\"${q%.ask}.part\"; "
    "mv -f \"${q%.ask}.part\" \"${q%.ask}.answer\"; done; sleep 0.5; done) </dev/null >/dev/null 2>&1 &"
)


def host_lines(sweep_dir: Path) -> List[str]:
    """The batch script's host-side helper: its dir (per job, emptied at each attempt's start), the
    variable that tells the job step where it is (also inside a container), its answers and its loop."""
    where = shlex.quote(str(Path(sweep_dir) / HOST_DIR)) + '/"$SLURM_JOB_ID"'
    return [
        TERM_TRAP,
        f"hpctrain_host={where}",
        'rm -rf "$hpctrain_host"; mkdir -p "$hpctrain_host" || echo "hpctrain: cannot create $hpctrain_host" >&2',
        f'export {HOST_DIR_ENV}="$hpctrain_host" APPTAINERENV_{HOST_DIR_ENV}="$hpctrain_host"',
        OWN_JOB,
        HOST_ANSWER,
        HOST_LOOP,
    ]


class SlurmLauncher(BaseLauncher):
    kind = "slurm"

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        # the cluster's answers the launch needs, asked now (in the background) while the plan is made
        self.ahead = Ahead()
        self.ahead.ask("limits", slurm.array_limits)
        self.ahead.ask("partitions", slurm.partitions)
        self.ahead.ask("cap", self._submit_cap)

    def _submit_cap(self) -> Optional[slurm_parse.SubmitCap]:
        return slurm.max_submit_jobs(self.params.account, self.params.qos)

    def _answer(self, name: str, fn: Any) -> Any:
        ahead = getattr(self, "ahead", None)  # a launcher used without setup (its tests): asked now
        return fn() if ahead is None else ahead.take(name, fn)

    def world_size(self) -> int:
        return int(self.params.nodes) * self.tasks_per_node()

    def requests_gpus(self) -> bool:
        """GPUs through gpus_per_node, or through any sbatch option that asks for them."""
        extra = {str(k).replace("-", "_"): str(v) for k, v in (self.params.additional_parameters or {}).items()}
        gres = any("gpu" in extra.get(k, "") for k in ("gres", "tres_per_node", "tres_per_task"))
        counted = any(k in extra and extra[k] not in ("", "0") for k in GPU_OPTIONS)
        return super().requests_gpus() or gres or counted

    def sbatch_parameters(self, python: str) -> Dict[str, Any]:
        values = {k: self.params[k] for k in SBATCH_NAMES if k in self.params}
        values["tasks_per_node"] = self.tasks_per_node()
        values["gpus_per_node"] = self.gpus_per_node() or None
        values["setup"] = [USR2_TRAP] + self.setup_lines()
        out = {SBATCH_NAMES.get(k, k): v for k, v in values.items() if v is not None and v != {} and v != []}
        out["setup"] = values["setup"]
        if "mem" in out:
            out["mem"] = convert_mem(float(out["mem"]))
        out["additional_parameters"] = dict(out.get("additional_parameters") or {})
        out["srun_args"] = list(out.get("srun_args") or [])
        if not any(a.startswith(("--kill-on-bad-exit", "-K")) for a in out["srun_args"]):
            # a rank that dies takes the step down, instead of leaving the others blocked in a collective
            out["srun_args"].insert(0, "--kill-on-bad-exit=1")
        if "cpus_per_task" in out and not any(a.startswith(("--cpus-per-task", "-c")) for a in out["srun_args"]):
            # Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation; without it a
            # binding task plugin leaves each rank one core for itself, its DataLoader and compile workers
            out["srun_args"].insert(1, f"--cpus-per-task={out['cpus_per_task']}")
        return out

    def teardown_lines(self, python: str, runs_file: Path, offset: int = 0) -> List[str]:
        """After srun: a run whose tasks died without a word (killed, OOM) is marked failed.

        ``offset``: where this array's tasks start in the submission's run list (several arrays)."""
        index = f"$(( ${{SLURM_ARRAY_TASK_ID:-0}} + {offset} ))" if offset else "${SLURM_ARRAY_TASK_ID:-0}"
        return [
            "hpctrain_rc=$?",  # srun's exit status: must be the first line after the srun line
            f'[ -n "${{hpctrain_term:-}}" ] || {python} -m hpctrain.job.attempt_ended {shlex.quote(str(runs_file))} '
            f'"{index}" "$hpctrain_rc" {int(self.params.max_retries)} '
            '|| echo "hpctrain: recording how the attempt ended failed (exit code $?)" >&2',
            'exit "$hpctrain_rc"',  # the job ends as its step did: sacct, --mail-type=FAIL and afterok see a failure
        ]

    def array_parameters(self, python: str, runs_file: Path, chunk: arrays.Chunk,
                         sweep_dir: Optional[Path] = None) -> Dict[str, Any]:
        """sbatch parameters of one array of the sweep (its offset in the teardown), with the host-side helper."""
        params = self.sbatch_parameters(python)
        params["setup"] = params["setup"][:1] + host_lines(sweep_dir or runs_file.parent.parent) + params["setup"][1:]
        params["teardown"] = self.teardown_lines(python, runs_file, chunk.offset)
        return params

    def resources(self) -> Dict[str, Any]:
        return dict(super().resources(), nodes=int(self.params.nodes), partition=self.params.partition)

    def limits(self) -> slurm_parse.ArrayLimits:
        if getattr(self, "_limits", None) is None:
            self._limits = self._answer("limits", slurm.array_limits)  # one scontrol call per launch
        return self._limits

    def chunks(self, n_tasks: int) -> List[arrays.Chunk]:
        return arrays.split(n_tasks, self.limits().tasks_per_array)

    def plan_arrays(self, submission: Submission) -> List[Array]:
        """The sweep's arrays, each with its sbatch parameters and the script submitit writes for it."""
        chunks = self.chunks(len(submission.tasks)) if submission.tasks else [arrays.Chunk(0, 0)]
        executor = dict(submission.executor, python=submission.python)
        out = []
        for i, chunk in enumerate(chunks):
            params = self.array_parameters(submission.python, submission.files.runs, chunk, submission.sweep_dir)
            shown = after(params, f"<job id of array {i}>") if i else params
            head = f"# array {i + 1} of {len(chunks)}: tasks {chunk.offset}..{chunk.offset + chunk.size - 1}\n"
            out.append(Array(chunk.offset, chunk.size, params, sbatch_script(executor, shown, chunk.size),
                             head if len(chunks) > 1 else ""))
        return out

    def cancel_orphans(self, sweep_dir: Path) -> None:
        """Cancel the arrays of this sweep an earlier command queued and never recorded (see the module doc),
        and wait until they have left the queue; raises when the queue cannot tell (nothing is submitted)."""
        scripts = [p for p in unsent_scripts(str(self.params.submitit_folder)) if _names(p, sweep_dir)]
        if not scripts:
            return
        found = slurm.jobs_of_scripts(os.path.basename(p) for p in scripts)
        if found is None:
            raise LaunchError(f"nothing submitted: an earlier command of this sweep was stopped during its sbatch "
                              f"({scripts[0]}) and squeue did not answer whether that array is queued; run the "
                              f"same command again")
        orphans = sorted({j for jobs in found.values() for j in jobs})
        if orphans:
            code, error = slurm.scancel(orphans)
            if code != 0:
                raise LaunchError(f"nothing submitted: scancel {' '.join(orphans)} (arrays of this sweep whose job ids "
                                  f"were never recorded) failed: {error}")
            print(f"hpctrain: cancelled Slurm job(s) {', '.join(orphans)}: queued by an earlier command of this sweep "
                  f"that was stopped before it recorded their job ids; their runs are submitted again",
                  file=sys.stderr)
            _wait_gone(orphans)
        for p in scripts:
            try:
                os.replace(p, p + ".orphan")  # looked at once: later commands need not ask the queue again
            except OSError:
                pass

    def send(self, submission: Submission, job: Any, job_ids: JobIds) -> List[Any]:
        """Each array by ``map_array`` with its parameters, each after the one before it; each array's job
        ids recorded as soon as it is queued. An sbatch that fails: one line saying what was queued."""
        import submitit

        executor = submitit.SlurmExecutor(python=submission.python, **submission.executor)
        arrays_ = [a for a in submission.arrays if a.size]
        with pickles_of_one_mode():
            return self._send_arrays(submission, executor, arrays_, job, job_ids)

    def _send_arrays(self, submission: Submission, executor: Any, arrays_: List[Array], job: Any,
                     job_ids: JobIds) -> List[Any]:
        jobs: List[Any] = []
        before = ""
        for n, array in enumerate(arrays_):
            executor.update_parameters(**(after(array.parameters, before) if before else array.parameters))
            try:
                part = executor.map_array(job, *submission.args(array.offset, array.offset + array.size))
            except Exception as exc:  # submitit's FailedJobError holds sbatch's stderr
                raise LaunchError(self.partial(submission.sweep_dir, n, len(arrays_), jobs, exc)) from None
            jobs += part
            tasks = submission.tasks[array.offset:array.offset + array.size]
            job_ids({spec.idx: str(j.job_id) for task, j in zip(tasks, part) for spec in task})
            before = slurm_parse.split_job_id(str(part[0].job_id))[0]
        return jobs

    @staticmethod
    def partial(sweep_dir: Path, queued: int, total: int, jobs: List[Any], exc: BaseException) -> str:
        """The line of a submission whose ``queued + 1``-th array's sbatch failed."""
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        error = lines[-1] if lines else type(exc).__name__
        if not queued:
            return f"nothing submitted: sbatch failed: {error}"
        ids = slurm_parse.array_ids(str(j.job_id) for j in jobs)
        return (f"{queued} of {total} arrays queued (job{'s' if len(ids) > 1 else ''} {', '.join(ids)}); array "
                f"{queued + 1} failed: {error}; python -m hpctrain cancel {sweep_dir}, or run the same command again "
                f"to submit the rest")

    def in_queue(self, job_ids: List[str]) -> Optional[Set[str]]:
        """Which of ``job_ids`` Slurm still has queued or running (held ones too); None where squeue failed."""
        queue = slurm.squeue(job_ids)
        if queue is None:
            return None
        arrays = {slurm_parse.split_job_id(j)[0] for j in queue}  # a pulled run's job: its workers' array
        return {j for j in job_ids if slurm_parse.in_queue(queue, j) or j in arrays}

    def most_workers(self) -> Optional["tuple[int, str]"]:
        """Pull workers are one array (chained arrays would start after the points are gone)."""
        most = self.limits().tasks_per_array
        return most, f"one array holds at most {most} tasks (MaxArraySize)"

    def queue_room(self, n_tasks: int) -> Optional["tuple[int, str]"]:
        """Whether ``n_tasks`` tasks fit under the cluster's cap on jobs (``MaxJobCount``) and the
        association's or QOS's (``MaxSubmitJobs``, read with sacctmgr where it answers, less what you have
        queued); None when they do, else how many do and the cap in words."""
        most = self.limits().max_job_count
        if most is not None and n_tasks > most:
            return most, f"the cluster holds at most {most} (MaxJobCount)"
        cap = self._answer("cap", self._submit_cap)
        if cap is None:
            return None
        limit, where, scope = cap
        queued = slurm.jobs_in_queue_of_user(scope)
        if queued is None:
            queued = 0
        if n_tasks + queued > limit:
            return limit - queued, f"you have {queued} there; {where} allows at most {limit} (MaxSubmitJobs)"
        return None

    def finish(self, runs: List[PlannedRun], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        ids = slurm_parse.array_ids(str(j.job_id) for j in jobs)
        n_tasks = len({str(j.job_id) for j in jobs})
        packed = f", {n_tasks} tasks of {self.runs_per_task()} runs" if self.runs_per_task() > 1 else ""
        if len(ids) > 1:
            print(f"hpctrain: submitted {len(runs)} run(s) as {len(ids)} Slurm arrays {', '.join(ids)} ({n_tasks} "
                  f"tasks{packed}; each array starts once the one before it has ended)")
        else:
            print(f"hpctrain: submitted {len(runs)} run(s) as Slurm job {ids[0]}"
                  f"{' (one array' + packed + ')' if n_tasks > 1 else ''}")
        print_next_commands(sweep_dir)
        if not self.params.wait:
            return [self.returns().placeholder(r, JobStatus.COMPLETED) for r in runs]
        return self._wait(runs, jobs, sweep_dir)

    def _wait(self, runs: List[PlannedRun], jobs: List[Any], sweep_dir: Path) -> List[JobReturn]:
        """Block until no task of the array is left in the queue, then collect results."""
        ids = [str(j.job_id) for j in jobs]
        job_of = {r.idx: i for r, i in zip(runs, ids)}
        queue: List[slurm_parse.QueueState] = [{}]
        progress = Progress(runs, alive=lambda idx: slurm_parse.in_queue(queue[0], job_of[idx]))

        def seen(answer: slurm_parse.QueueState) -> None:
            queue[0] = answer
            progress.update()

        # a failed squeue call is "unknown", never "gone": the wait goes on until the queue answers empty
        try:
            slurm.poll_squeue(ids, 10.0, lambda q: not any(slurm_parse.in_queue(q, i) for i in ids), seen)
        except KeyboardInterrupt:  # only the wait ends: the jobs are Slurm's
            progress.clear()
            where = shlex.quote(str(sweep_dir))
            print(f"hpctrain: Ctrl-C: stopped waiting; Slurm job(s) {', '.join(slurm_parse.array_ids(ids))} go on "
                  f"(python -m hpctrain status {where}; to cancel them: python -m hpctrain cancel {where})",
                  file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        progress.close()
        returns = []
        for run, job in zip(runs, jobs):
            if job.paths.result_pickle.exists():
                returns.append(self.returns().collect(run, job))
            else:
                error = LaunchError(f"run {run.idx} ended without a result (see {job.paths.stderr})")
                returns.append(self.returns().failed(run, error))
        return results.report(runs, returns, sweep_dir)

    # ------------------------------------------------------------------ login-node checks
    def check_resources(self) -> List[str]:
        problems: List[str] = []
        p = self.params
        for key in ("nodes", "array_parallelism"):
            if int(p[key]) < 1:
                problems.append(f"hydra.launcher.{key}={p[key]}: expected an integer >= 1")
        for key in ("tasks_per_node", "gpus_per_node", "cpus_per_task"):
            if p[key] is not None and int(p[key]) < (1 if key != "gpus_per_node" else 0):
                problems.append(f"hydra.launcher.{key}={p[key]}: expected a positive integer")
        if p.mem_gb is not None and float(p.mem_gb) <= 0:
            problems.append(f"hydra.launcher.mem_gb={p.mem_gb}: expected a number > 0")
        if problems:
            return problems
        return problems + self._check_against_cluster()

    def _check_against_cluster(self) -> List[str]:
        """Requests no node of the partition can meet, asked of the cluster itself (sinfo/scontrol)."""
        p = self.params
        partitions = self._answer("partitions", slurm.partitions)
        if partitions is None:
            return []  # no Slurm tools here, or scontrol did not answer: nothing to compare against
        name = p.partition or next((n for n, v in partitions.items() if v.default), None)
        if name is None:
            return []
        if name not in partitions:
            return [f"hydra.launcher.partition={name!r}: no such partition (have: {', '.join(sorted(partitions))})"]
        part = partitions[name]
        problems = []
        max_time = part.max_time_min
        if max_time is not None and int(p.timeout_min) > max_time:
            problems.append(f"hydra.launcher.timeout_min={p.timeout_min}: partition {name!r} allows at most {max_time}")
        nodes = part.nodes
        if int(p.nodes) > len(nodes):
            problems.append(f"hydra.launcher.nodes={p.nodes}: partition {name!r} has {len(nodes)} node(s)")
        if nodes:
            max_gpus = max(n.gpus for n in nodes)
            max_cpus = max(n.cpus for n in nodes)
            if self.gpus_per_node() > max_gpus:
                problems.append(f"hydra.launcher.gpus_per_node={self.gpus_per_node()}: nodes of partition "
                                f"{name!r} have at most {max_gpus} GPU(s)")
            cpus = self.tasks_per_node() * int(p.cpus_per_task or 1)
            if cpus > max_cpus:
                problems.append(f"hydra.launcher: tasks_per_node x cpus_per_task = {cpus} CPUs: nodes of partition "
                                f"{name!r} have at most {max_cpus}")
            max_mem = max(n.mem_mb for n in nodes)
            if p.mem_gb is not None and float(p.mem_gb) * 1024 > max_mem:
                problems.append(f"hydra.launcher.mem_gb={p.mem_gb}: nodes of partition {name!r} have at most "
                                f"{max_mem / 1024:.1f} GB")
        return problems


def _names(script: str, sweep_dir: Path) -> bool:
    """Whether an sbatch script is one of this sweep's (its teardown reads the sweep's run list)."""
    try:
        with open(script, errors="replace") as f:
            return f"{Path(sweep_dir).absolute()}/.hpctrain/" in f.read()
    except OSError:
        return False


def _wait_gone(job_ids: List[str], timeout_s: float = 120.0) -> None:
    """Until the cancelled jobs have left the queue (a running task's teardown ends first)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        queue = slurm.squeue(job_ids)
        if queue is not None and not any(slurm_parse.in_queue(queue, j) for j in job_ids):
            return
        time.sleep(2.0)
    raise LaunchError(f"nothing submitted: cancelled job(s) {', '.join(job_ids)} still in the queue after "
                      f"{timeout_s:.0f} s; run the same command again once they have left it")


def after(params: Dict[str, Any], job_id: str) -> Dict[str, Any]:
    """``params`` with ``--dependency=afterany:JOB_ID`` added to any dependency the user gave."""
    extra = dict(params.get("additional_parameters") or {})
    mine = f"afterany:{job_id}"
    extra["dependency"] = f"{extra['dependency']},{mine}" if extra.get("dependency") else mine
    return dict(params, additional_parameters=extra)
