"""The Slurm launcher on the real test cluster (slurm/test-cluster.sh): nothing mocked."""

import subprocess

import pytest
import torch

from cli_helpers import run_hpctrain, tb_scalars
from isolation import MODES, mode_for, ran_as, ran_contained
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


@pytest.fixture(params=MODES)
def mode(request, tmp_path):
    """Bare, or inside a container that hides Slurm from the job (issue 27): the same test either way."""
    return mode_for(request.param, tmp_path)


def test_readme_sweep_returns_while_queued_then_completes(tmp_path, mode):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "max_steps=60", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
                         *mode.args], cwd=tmp_path, timeout=60, env=mode.env)
    job = job_id(sweep)
    try:
        # submit and return: the array is still in the queue when the command has exited
        assert queued(job), "the sweep command waited for the jobs to end"
        assert f"submitted 2 run(s) as Slurm job {job}" in proc.stdout
        assert f"python -m hpctrain status {sweep}" in proc.stdout
        dirs = [sweep / "0_lr=0.001", sweep / "1_lr=0.0001"]
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in dirs), 180, "both runs to complete")
        for d in dirs:
            assert tb_scalars(d, "train/loss")
            assert metrics(d)["step"] == 60
        wait_for(lambda: not queued(job), 30, "the array to leave the queue")
        assert ran_contained(tmp_path) == mode.contained
    finally:
        cancel(job)


def test_the_utilisation_sampler_writes_cpu_and_memory_figures_without_nvml(tmp_path, mode):
    """psutil's CPU and memory figures into TensorBoard (sys/*) and metrics.json; no NVML here (no GPU, and
    the image has no driver library): no GPU figures, no error."""
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=300", "log_every=50", "eval_every=0", "hydra/launcher=slurm",
                  "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}", *mode.args], cwd=tmp_path, timeout=300,
                 env={**mode.env, "HPCTRAIN_SAMPLE_EVERY_S": "0.1"})
    (run_dir,) = run_dirs(sweep)
    record = metrics(run_dir)
    assert record["status"] == "completed", record
    sampled = record["sys"]
    assert sampled["samples"] >= 2 and sampled["rss_peak_gb"] > 0 and sampled["cpu_mean"] >= 0, sampled
    assert not [k for k in sampled if k.startswith("gpu_")], sampled
    assert len(tb_scalars(run_dir, "sys/rss")) >= 2 and tb_scalars(run_dir, "sys/cpu")
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.*"))
    assert "Traceback" not in logs and "NVML" not in logs, logs[-2000:]
    assert ran_contained(tmp_path) == mode.contained


def test_two_nodes_two_tasks_each_is_four_gloo_ranks(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=30", "model._target_=user_models.RankDump", f"+model.dump_dir={dump}",
                  "hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2",
                  "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=240)
    (run_dir,) = run_dirs(sweep)
    record = metrics(run_dir)
    assert record["status"] == "completed" and record["world_size"] == 4
    weights = [torch.load(dump / f"rank{r}.pt") for r in range(4)]
    for w in weights[1:]:
        assert all(torch.equal(w[k], weights[0][k]) for k in w)
    # the tasks really ran on both virtual nodes
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.out"))
    assert "node=0(2)" in logs and "node=1(2)" in logs


@pytest.mark.parametrize("mode", [*MODES, "contain"], indirect=True)
def test_preempted_run_requeues_resumes_and_matches_uninterrupted(tmp_path, mode):
    """Also with container.args=[--contain] (no $HOME, /tmp or $PWD of the host: the job has what hpctrain binds)."""
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=0,0", "max_steps=4000", "log_every=20", "eval_every=0",
            "ckpt_every=0", "model.hidden=64", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}", *mode.args]
    run_hpctrain(args, cwd=tmp_path, timeout=60, env=mode.env)
    job = job_id(sweep)
    try:
        preempted, uninterrupted = sweep / "0", sweep / "1"  # seed=0,0: the same run twice
        wait_for(lambda: metrics(preempted).get("step", 0) >= 200, 120, "the run to be under way")
        subprocess.run(["scancel", "--signal=USR2", "--full", f"{job}_0"], check=True)
        wait_for(lambda: metrics(preempted).get("status") == "requeued", 60, "the checkpoint on USR2")
        stopped_at = torch.load(preempted / "checkpoints" / "last.pt", weights_only=True)["step"]
        assert 200 <= stopped_at < 4000
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in (preempted, uninterrupted)), 240,
                 "both runs to complete")
        show = subprocess.run(["scontrol", "show", "job", f"{job}_0"], capture_output=True, text=True).stdout
        # requeued once by Slurm itself, and the record saw both attempts, one requeue between them
        assert "Restarts=1" in show, show
        assert record_kinds(preempted) == ["submitted", "started", "requeued", "started", "completed"]
        log = (preempted / "hpctrain.log").read_text()
        assert f"resumed from {preempted / 'checkpoints' / 'last.pt'} at step {stopped_at}" in log
        a = torch.load(preempted / "checkpoints" / "last.pt", weights_only=True)
        b = torch.load(uninterrupted / "checkpoints" / "last.pt", weights_only=True)
        assert a["step"] == b["step"] == 4000
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
        # the same TensorBoard run goes on: one curve, no step logged twice
        steps = _tb_steps(preempted)
        assert steps == sorted(set(steps)) and steps[-1] == 4000
        assert ran_as(tmp_path, mode)
    finally:
        cancel(job)


def _tb_steps(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]


def test_crash_is_retried_and_always_failing_run_ends_failed(tmp_path, mode):
    sweep, marker = tmp_path / "sweep", tmp_path / "marker"
    marker.mkdir()
    proc = run_hpctrain(["-m", "model._target_=user_models.Flaky,user_models.Boom,user_models.TinyNet",
                         f"+model.marker_dir={marker}", "max_steps=20", "hydra/launcher=slurm",
                         "hydra.launcher.max_retries=1", "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}",
                         *mode.args], cwd=tmp_path, timeout=300, check=False, env=mode.env)
    assert proc.returncode != 0 and "1 of 3 run(s) failed" in proc.stderr + proc.stdout
    flaky, boom, fine = run_dirs(sweep)
    assert metrics(flaky)["status"] == "completed"
    assert metrics(fine)["status"] == "completed"
    record = metrics(boom)
    assert record["status"] == "failed" and "Boom: this model always fails" in record["error"]
    assert record_kinds(flaky) == ["submitted", "started", "failed", "retrying", "started", "completed"]
    assert record_kinds(boom) == ["submitted", "started", "failed", "retrying", "started", "failed"]
    # the job ends as its step did: accounting (and --mail-type=FAIL, afterok) sees the failed run fail
    job = job_id(sweep)

    def final_states():
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", f"{job}_1,{job}_2", "-o", "JobID,State"],
                             capture_output=True, text=True).stdout
        return dict(line.split("|")[:2] for line in out.split())

    wait_for(lambda: set(final_states().values()) <= {"FAILED", "COMPLETED"} and len(final_states()) == 2, 60,
             "accounting to hold both jobs' ends")
    assert final_states() == {f"{job}_1": "FAILED", f"{job}_2": "COMPLETED"}
    assert ran_contained(tmp_path) == mode.contained


def test_preempted_two_rank_run_agrees_on_the_step_and_resumes(tmp_path):
    """Both ranks get USR2; they agree on the step (within one step, not only at log steps), rank 0
    checkpoints, the job requeues and resumes, and ends with the weights of the same two-rank run never
    interrupted."""
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "seed=0,0", "max_steps=1000", "log_every=10", "eval_every=0",
                  "ckpt_every=0", "model.hidden=64", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=60)
    job = job_id(sweep)
    try:
        run_dir, uninterrupted = sweep / "0", sweep / "1"  # seed=0,0: the same run twice
        wait_for(lambda: (metrics(run_dir).get("step") or 0) >= 100, 300, "the run to be under way")
        assert metrics(run_dir)["world_size"] == 2
        subprocess.run(["scancel", "--signal=USR2", "--full", f"{job}_0"], check=True)
        wait_for(lambda: metrics(run_dir).get("status") == "requeued", 60, "the checkpoint on USR2")
        stopped_at = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"]
        assert 100 <= stopped_at < 1000  # any step: the ranks agree on a stop one step after it was asked
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in (run_dir, uninterrupted)), 400,
                 "both runs to complete")
        assert f"at step {stopped_at}" in (run_dir / "hpctrain.log").read_text()
        assert record_kinds(run_dir).count("started") == 2 and record_kinds(uninterrupted).count("started") == 1
        a = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
        b = torch.load(uninterrupted / "checkpoints" / "last.pt", weights_only=True)
        assert a["step"] == b["step"] == 1000
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
    finally:
        cancel(job)
