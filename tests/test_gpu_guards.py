"""The GPU path's wrong states, reached without a GPU: torch's CUDA queries are replaced at the
``hpctrain.train.distributed`` seam (``cuda_available``/``device_count``), nothing else is stubbed."""

import json
import time

import pytest
import torch

from cli_helpers import run_hpctrain

from hpctrain.train import distributed
from hpctrain.train.distributed import device_index, gpus_given, pick_device


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(distributed, "cuda_available", lambda: False)
    monkeypatch.setattr(distributed, "device_count", lambda: 0)


@pytest.mark.parametrize("env", [
    {"CUDA_VISIBLE_DEVICES": "0"},
    {"CUDA_VISIBLE_DEVICES": "2,3"},
    {"SLURM_GPUS_ON_NODE": "1"},
    {"SLURM_JOB_GPUS": "0,1"},
    {"SLURM_STEP_GPUS": "1"},
])
def test_auto_with_gpus_given_but_no_cuda_is_an_error(no_cuda, env):
    with pytest.raises(RuntimeError, match=r"the job was given GPUs \(.+\) but torch sees no CUDA device"):
        pick_device("auto", 0, 1, env)


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},
                                 {"SLURM_GPUS_ON_NODE": "0"}, {"CUDA_VISIBLE_DEVICES": "-1"}])
def test_auto_without_gpus_given_is_cpu(no_cuda, env):
    assert gpus_given(env) is None
    assert pick_device("auto", 0, 1, env) == torch.device("cpu")


def test_cpu_is_cpu_and_cuda_without_cuda_fails(no_cuda):
    assert pick_device("cpu", 0, 1, {"CUDA_VISIBLE_DEVICES": "0"}) == torch.device("cpu")
    with pytest.raises(RuntimeError, match="device=cuda but torch sees no CUDA device"):
        pick_device("cuda", 0, 1, {})


def test_every_rank_sees_every_gpu_of_the_node():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert [device_index(r, 4, 4, env) for r in range(4)] == [0, 1, 2, 3]
    assert [device_index(r, 2, 4, env) for r in range(2)] == [0, 1]


def test_each_task_bound_to_its_own_gpus():
    # `srun -n 2 --gpus-per-task=1` on the test cluster (Slurm 22.05) gave exactly these variables
    for rank in (0, 1):
        env = {"CUDA_VISIBLE_DEVICES": str(rank), "SLURM_STEP_GPUS": str(rank), "SLURM_GPUS_ON_NODE": "2"}
        assert device_index(rank, 2, 1, env) == 0
    # four tasks, one GPU each, of a node's four
    assert device_index(3, 4, 1, {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "4"}) == 0
    # two GPUs per task: the second task takes the second of its own pair (its local rank)
    assert device_index(1, 2, 2, {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_ON_NODE": "4"}) == 1


@pytest.mark.parametrize("local_rank,tasks,visible,env", [
    (2, 4, 2, {"CUDA_VISIBLE_DEVICES": "0,1"}),  # tasks_per_node > gpus_per_node: rank 2 would take GPU 0
    (1, 2, 1, {"CUDA_VISIBLE_DEVICES": "0"}),
    (0, 3, 2, {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1"}),  # rank 2 of 3 would share
    (3, 4, 1, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "2"}),  # 4 tasks bound to 2 GPUs
    (1, 2, 1, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}),  # --gpus-per-node=1, 2 tasks
])
def test_ranks_that_would_share_a_gpu_fail_with_the_numbers(local_rank, tasks, visible, env):
    with pytest.raises(RuntimeError, match=rf"local rank {local_rank} of {tasks} task\(s\) on this node sees "
                                           rf"{visible} CUDA device\(s\).*ranks would share a GPU"):
        device_index(local_rank, tasks, visible, env)


def test_a_run_given_a_gpu_without_cuda_fails_and_says_why(tmp_path):
    """For real: this machine's torch has no CUDA, and the job is told it has GPU 0."""
    assert not torch.cuda.is_available()
    run_dir = tmp_path / "run"
    proc = run_hpctrain(["max_steps=5", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                        env={"CUDA_VISIBLE_DEVICES": "0"}, check=False, timeout=120)
    assert proc.returncode != 0
    assert "the job was given GPUs (CUDA_VISIBLE_DEVICES=0) but torch sees no CUDA device" in proc.stderr
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "failed" and "torch sees no CUDA device" in record["error"]
    assert not (run_dir / "checkpoints").exists()  # it did not train on CPU


def test_a_failing_rank_ends_a_two_rank_run_promptly_on_the_local_launcher(tmp_path):
    start = time.time()
    proc = run_hpctrain(["-m", "model._target_=user_models.RankOneFails", "max_steps=50", "hydra/launcher=local",
                         "hydra.launcher.tasks_per_node=2", "hydra.launcher.max_retries=0",
                         f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path, check=False, timeout=300)
    elapsed = time.time() - start
    assert proc.returncode != 0
    assert elapsed < 90, f"took {elapsed:.0f} s: a rank waited on its dead peer"
    (run_dir,) = [p for p in (tmp_path / "s").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert "RankOneFails: rank 1 is out" in json.loads((run_dir / "metrics.json").read_text())["error"]
