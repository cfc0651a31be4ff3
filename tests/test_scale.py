"""Scale: sweeps past the cluster's array limit, several runs per task, queue caps (issue 13).

Slurm tests run on the real test cluster (MaxArraySize=1001, Slurm's default); the queue-cap test sets a
real association limit with sacctmgr on an account of its own, and removes it after.
"""

import json
import subprocess
import sys
import uuid

import pytest

from cli_helpers import hpctrain_env, run_hpctrain
from hpctrain.core.state import State
from hpctrain.slurm import parse as slurm_parse, query as slurm
from hpctrain.job import pack
from hpctrain.submit import arrays
from slurm_helpers import metrics, queued, record_kinds, run_dirs, wait_for


# ---------------------------------------------------------------- pure parts
def test_arrays_split_by_the_limit_each_from_zero_with_its_offset():
    assert arrays.split(1200, 1001) == [arrays.Chunk(0, 1001), arrays.Chunk(1001, 199)]
    assert arrays.split(1001, 1001) == [arrays.Chunk(0, 1001)]
    assert arrays.split(5, 2) == [arrays.Chunk(0, 2), arrays.Chunk(2, 2), arrays.Chunk(4, 1)]
    assert arrays.split(0, 1001) == []


def test_array_limits_take_the_tighter_of_max_array_size_and_max_array_tasks():
    limits = slurm_parse.array_limits_from({"MaxArraySize": "1001", "SchedulerParameters": "bf_interval=1,max_array_tasks=300"})
    assert limits.tasks_per_array == 300
    assert slurm_parse.array_limits_from({"MaxJobCount": "10000"}).max_job_count == 10000
    assert slurm_parse.array_limits_from({}).tasks_per_array == 1001  # unreadable: Slurm's default


def test_slots_spread_runs_over_gpus_and_share_out_cpus():
    # 5 runs on 2 GPUs: round robin, several per GPU; 8 CPUs in 5 shares differing by at most one
    placed = pack.slots(5, ["0", "1"], list(range(8)))
    assert [g for g, _ in placed] == ["0", "1", "0", "1", "0"]
    shares = [c for _, c in placed]
    assert sorted(sum(shares, [])) == list(range(8)) and {len(c) for c in shares} <= {1, 2}
    # CPU node, fewer CPUs than runs: they share round robin; every run gets at least one
    assert pack.slots(3, [], [4, 5]) == [(None, [4]), (None, [5]), (None, [4])]


def test_max_submit_from_association_and_qos_the_tighter_wins():
    assoc = "acct_a|alice|50|normal,long|normal\nacct_b|alice||normal|\n"
    qos = "normal|20\nlong|\n"
    assert slurm_parse.parse_max_submit(assoc, qos, None, None, "alice") == (20, "QOS normal (MaxSubmitJobsPerUser)",
                                                                            ("-q", "normal"))
    assert slurm_parse.parse_max_submit(assoc, "normal|\n", "acct_a", None, "alice")[::2] == (50, ("-A", "acct_a"))
    assert slurm_parse.parse_max_submit(assoc, "normal|\n", "acct_b", None, "alice") is None
    assert slurm_parse.parse_max_submit("", "", None, None, "alice") is None
    # no --account: sbatch uses the default account, whose association has no cap (not the first row's)
    assert slurm_parse.parse_max_submit(assoc, "normal|\n", None, None, "alice", default_account="acct_b") is None
    assert slurm_parse.parse_max_submit(assoc, "normal|\n", None, None, "alice", default_account="gone")[0] == 50


# ---------------------------------------------------------------- the real cluster
def _squeue_tasks(ids):
    out = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sweep_past_max_array_size_is_several_arrays_one_sweep(tmp_path):
    limits = slurm.array_limits()
    n = limits.tasks_per_array + 199  # 1,200 on Slurm's default 1001
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", f"seed=range({n})", "max_steps=5", "hydra/launcher=slurm",
                         "+hydra.launcher.additional_parameters.hold=true", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path, timeout=300)
    manifest = json.loads((sweep / "sweep.json").read_text())
    ids = manifest["submissions"][-1]["job_ids"]
    try:
        assert len(ids) == 2, proc.stdout
        assert f"as 2 Slurm arrays {ids[0]}, {ids[1]}" in proc.stdout
        tasks = _squeue_tasks(ids)
        assert len(tasks) == n  # every task present, held
        assert sorted(t for t in tasks if t.startswith(f"{ids[1]}_")) == sorted(f"{ids[1]}_{i}" for i in range(199))
        # each run's job id is its array task: offset into the sweep, index from 0 in its array
        runs = manifest["runs"]
        assert runs["0"]["job_id"] == f"{ids[0]}_0" and runs[str(n - 1)]["job_id"] == f"{ids[1]}_198"
        # the second array waits for the first (the sweep's array_parallelism holds across arrays)
        show = subprocess.run(["scontrol", "show", "job", ids[1]], capture_output=True, text=True).stdout
        assert f"Dependency=afterany:{ids[0]}" in show
        status = run_hpctrain(["status", str(sweep), "--json"], cwd=tmp_path, timeout=120, check=False)
        rows = json.loads(status.stdout)
        rows = rows["runs"] if isinstance(rows, dict) else rows
        assert len(rows) == n and {r["state"] for r in rows} == {"held"}  # submitted with hold=true
        run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, timeout=120)
        assert _squeue_tasks(ids) == []
    finally:
        subprocess.run(["scancel", *ids], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_packed_sweep_runs_as_two_tasks_and_all_complete(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "seed=range(8)", "max_steps=5", "hydra/launcher=slurm", "hydra.launcher.runs_per_task=4",
                         "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300)
    assert "(one array, 2 tasks of 4 runs)" in proc.stdout
    manifest = json.loads((sweep / "sweep.json").read_text())
    job_ids = [manifest["runs"][str(i)]["job_id"] for i in range(8)]
    array = job_ids[0].split("_")[0]
    assert job_ids == [f"{array}_0"] * 4 + [f"{array}_1"] * 4
    dirs = run_dirs(sweep)
    assert len(dirs) == 8
    for d in dirs:
        assert metrics(d)["status"] == "completed" and metrics(d)["step"] == 5
        assert record_kinds(d).count("started") == 1  # run once, not twice
    # each packed run ran in a process of its own, pinned to a share of the task's CPUs
    log = (dirs[0] / ".hpctrain" / "task.log").read_text()
    assert "Traceback" not in log


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_packed_run_cancelled_alone_then_task_preempted_with_usr2_resumes_the_others(tmp_path):
    """Three runs in one task. `cancel --run 2` stops run 2 only (the task reads its record) and `status`
    points at run 2's own log; then USR2: runs 0 and 1 checkpoint, the task requeues, they resume and
    complete; run 2 is not run again."""
    sweep = tmp_path / "sweep"
    # at least 15 s of training per run before the requeue (a sleep per step), none after it
    run_hpctrain(["-m", "seed=range(3)", "max_steps=3000", "log_every=20", "eval_every=0", "ckpt_every=0",
                  "model._target_=user_models.SlowDropout", "+model.delay_s=0.005", "+model.first_attempt_only=true",
                  "hydra/launcher=slurm", "hydra.launcher.runs_per_task=3",
                  "hydra.launcher.cpus_per_task=2", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=120)
    manifest = json.loads((sweep / "sweep.json").read_text())
    job = manifest["runs"]["0"]["job_id"]
    try:
        wait_for(lambda: len(run_dirs(sweep)) == 3 and all(metrics(d).get("step", 0) >= 100 for d in run_dirs(sweep)),
                 240, "all three packed runs to be under way")
        dirs = run_dirs(sweep)
        cancel = subprocess.run([sys.executable, "-m", "hpctrain", "cancel", str(sweep), "--run", "2"], cwd=tmp_path,
                                env=hpctrain_env(), capture_output=True, text=True, timeout=120)
        assert cancel.returncode == 0 and "#2" in cancel.stdout and "NOT" not in cancel.stdout, cancel.stdout + cancel.stderr
        assert any(line.split()[0] == job for line in queued(job)), "the task was cancelled with its run"
        step = metrics(dirs[2]).get("step")
        status = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep), "--json"],
                                           cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True,
                                           timeout=120).stdout)["runs"]
        assert [r["state"] for r in status] == ["running", "running", "cancelled"], status
        assert status[2]["log"] == str(dirs[2] / ".hpctrain" / "task.log")  # its own output, not the task's
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # the job steps, as Slurm's --signal does
        wait_for(lambda: all("requeued" in record_kinds(d) for d in dirs[:2]), 120, "runs 0 and 1 to checkpoint")
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in dirs[:2]), 420, "runs 0 and 1 to complete")
        for d in dirs[:2]:
            assert record_kinds(d).count("started") == 2
            assert "resumed from" in (d / "hpctrain.log").read_text()
            assert metrics(d)["step"] == 3000
        kinds = record_kinds(dirs[2])
        assert kinds.count("started") == 1 and kinds[-1] == "cancelled", kinds
        assert metrics(dirs[2])["status"] == "cancelled" and metrics(dirs[2]).get("step") == step
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sweep_over_the_queue_cap_is_pulled_by_as_many_workers_as_fit(tmp_path):
    """Over the account's MaxSubmitJobs the sweep is not refused: as many workers as the cap leaves room for
    pull its runs (one line with the numbers), each run completed once."""
    account = f"hpct{uuid.uuid4().hex[:8]}"
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    add = subprocess.run(["sacctmgr", "-i", "add", "account", account], capture_output=True, text=True)
    if add.returncode != 0:
        pytest.fail(f"sacctmgr cannot add an account (is accounting on?): {add.stderr}")
    held = ""
    try:
        subprocess.run(["sacctmgr", "-i", "add", "user", user, f"account={account}", "MaxSubmitJobs=3"],
                       check=True, capture_output=True)
        sweep = tmp_path / "sweep"
        # the cap binds the account's jobs only: a held job of the user's in another account does not count
        held = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"],
                              capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
        queued_before = len(subprocess.run(["squeue", "-h", "-r", "-u", user, "-A", account, "-o", "%i"],
                                           capture_output=True, text=True).stdout.split())
        room = 3 - queued_before
        proc = run_hpctrain(["-m", "seed=range(8)", "max_steps=5", "hydra/launcher=slurm", "hydra.launcher.wait=true",
                             f"hydra.launcher.account={account}", f"hydra.sweep.dir={sweep}"],
                            cwd=tmp_path, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        line = next(line for line in proc.stdout.splitlines() if "workers pull the runs instead" in line)
        assert line == (f"hpctrain: 8 runs would be 8 jobs in the queue and you have {queued_before} there; the "
                        f"association of user {user}, account {account} allows at most 3 (MaxSubmitJobs): {room} "
                        f"workers pull the runs instead (hydra.launcher.workers={room})"), line
        dirs = run_dirs(sweep)
        assert len(dirs) == 8 and all(record_kinds(d).count("completed") == 1 for d in dirs), \
            [record_kinds(d) for d in dirs]
        assert len(json.loads((sweep / "sweep.json").read_text())["submissions"][-1]["worker_job_ids"]) == room
        # packed, the same sweep fits: 2 tasks
        proc = run_hpctrain(["-m", "seed=range(8)", "max_steps=5", "hydra/launcher=slurm",
                             "hydra.launcher.runs_per_task=4", "hydra.launcher.dry_run=true",
                             f"hydra.launcher.account={account}", f"hydra.sweep.dir={tmp_path / 'packed'}"],
                            cwd=tmp_path, timeout=120)
        assert "8 to submit as 2 task(s)" in proc.stdout
        # without --account the job goes to the user's default account: the capped one binds nothing
        proc = run_hpctrain(["-m", "seed=range(8)", "max_steps=5", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                             f"hydra.sweep.dir={tmp_path / 'default'}"], cwd=tmp_path, timeout=120)
        assert "runs (8 to submit, 0 already completed):" in proc.stdout, proc.stdout
    finally:
        if held:
            subprocess.run(["scancel", held], capture_output=True)
        subprocess.run(["sacctmgr", "-i", "delete", "user", user, f"account={account}"], capture_output=True)
        subprocess.run(["sacctmgr", "-i", "delete", "account", account], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_packed_runs_retry_each_on_its_own_and_completed_runs_are_not_run_again(tmp_path):
    sweep, marker = tmp_path / "sweep", tmp_path / "marker"
    marker.mkdir()
    proc = run_hpctrain(["-m", "model._target_=user_models.Flaky,user_models.Boom,user_models.TinyNet",
                         f"+model.marker_dir={marker}", "max_steps=20", "hydra/launcher=slurm",
                         "hydra.launcher.runs_per_task=3", "hydra.launcher.max_retries=1", "hydra.launcher.wait=true",
                         f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode != 0 and "1 of 3 run(s) failed" in proc.stderr + proc.stdout
    flaky, boom, fine = run_dirs(sweep)
    assert metrics(flaky)["status"] == "completed" and metrics(fine)["status"] == "completed"
    assert metrics(boom)["status"] == "failed" and "Boom: this model always fails" in metrics(boom)["error"]
    assert record_kinds(flaky) == ["submitted", "started", "failed", "retrying", "started", "completed"]
    assert record_kinds(boom) == ["submitted", "started", "failed", "retrying", "started", "failed"]
    assert record_kinds(fine) == ["submitted", "started", "completed"]  # the task's retry left it alone


def test_local_launcher_packs_runs_into_tasks(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "seed=range(4)", "max_steps=5", "hydra/launcher=local", "hydra.launcher.runs_per_task=2",
                         f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300)
    assert "4 run(s) on this machine, 1 task(s) at a time, 2 runs side by side in each" in proc.stdout
    manifest = json.loads((sweep / "sweep.json").read_text())
    jobs = [manifest["runs"][str(i)]["job_id"] for i in range(4)]
    assert jobs[0] == jobs[1] != jobs[2] == jobs[3]  # two tasks (local processes) of two runs
    for d in run_dirs(sweep):
        assert metrics(d)["status"] == "completed" and record_kinds(d) == ["submitted", "started", "completed"]


def test_a_retry_attempt_that_dies_before_its_run_starts_ends_failed(tmp_path):
    """Seen in the 1,000-run benchmark: tasks that died before starting their runs left them 'retrying'."""
    from hpctrain.core import events
    from hpctrain.job.attempt_ended import attempt_ended

    run = tmp_path / "run"
    events.submitted(run)
    events.started(run, job_id="1_0")
    events.failed(run, "RuntimeError: first attempt", rank=0)
    assert attempt_ended(run, 1, max_retries=1) == 1  # retried once
    assert events.read(run).state == State.RETRYING
    assert attempt_ended(run, 1, max_retries=1) is None  # the retry died without starting: budget used
    assert events.read(run).state == State.FAILED
