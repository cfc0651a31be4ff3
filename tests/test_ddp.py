"""DDP over gloo with several local processes: through the launcher, and the all-reduce count."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from cli_helpers import hpctrain_env, run_hpctrain, tb_scalars
from trainer_helpers import compose, gloo_ranks, state_close


def test_two_ranks_through_local_launcher_agree(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    run_hpctrain(["-m", "max_steps=30", "model._target_=user_models.RankDump", f"+model.dump_dir={dump}",
                  "hydra/launcher=local", "hydra.launcher.tasks_per_node=2", f"hydra.sweep.dir={tmp_path / 's'}"],
                 cwd=tmp_path)
    rank0, rank1 = (torch.load(dump / f"rank{r}.pt") for r in (0, 1))
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    # the checkpoint holds rank 0's (= every rank's) weights
    (run_dir,) = [p for p in (tmp_path / "s").iterdir() if p.is_dir() and not p.name.startswith(".")]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 30
    assert state_close(ckpt["model"], rank0, atol=0)


def _count_allreduces(trainer) -> list:
    """Fit, counting DDP's all-reduces: the step of each."""
    calls = []

    def counting_hook(state, bucket):
        calls.append(trainer.step)
        return default_hooks.allreduce_hook(state, bucket)

    trainer.model.register_comm_hook(None, counting_hook)
    trainer.fit()
    return calls


def test_one_allreduce_per_optimizer_step_with_accumulation(tmp_path):
    steps, accum = 6, 4
    overrides = [f"max_steps={steps}", f"grad_accum={accum}", "batch_size=64", "log_every=3", "eval_every=0"]
    calls = gloo_ranks(2, overrides, tmp_path, _count_allreduces)
    for rank in (0, 1):
        # one bucket (small model): exactly one all-reduce per optimizer step, none on the 3 other micro-steps
        assert calls[rank] == list(range(steps)), calls[rank]


def test_torchrun_two_processes(tmp_path):
    """Without a launcher: torchrun's variables; every rank needs the same run dir, hence hydra.run.dir."""
    run_dir = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc-per-node", "2", "-m", "hpctrain", f"hydra.run.dir={run_dir}",
                           "max_steps=20"], cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "completed" and record["world_size"] == 2


def _train_alone(index: int, overrides: list, run_dir: str) -> None:
    """One plain process, no process group (a child: the Trainer's logging stays out of pytest's process)."""
    from hpctrain.train.distributed import DistInfo
    from hpctrain.train.trainer import Trainer

    Trainer(compose(overrides), run_dir, DistInfo()).fit()


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_two_ranks_match_one_process_on_the_same_global_batch(tmp_path, grad_accum):
    """2 gloo ranks (micro-batch 64 / (2 x accum)) against ONE process (micro-batch 64 / accum)."""
    overrides = ["max_steps=20", "batch_size=64", f"grad_accum={grad_accum}", "log_every=10", "eval_every=0"]
    gloo_ranks(2, overrides, tmp_path / "ddp")
    mp.spawn(_train_alone, args=(overrides, str(tmp_path / "one")), nprocs=1)
    ddp = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=True)
    one = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=True)
    assert json.loads((tmp_path / "ddp" / "metrics.json").read_text())["world_size"] == 2
    assert json.loads((tmp_path / "one" / "metrics.json").read_text())["world_size"] == 1
    assert ddp["step"] == one["step"] == 20
    assert state_close(ddp["model"], one["model"], atol=1e-5)
    losses = tb_scalars(tmp_path / "one", "train/loss")
    assert losses[-1] < losses[0]  # it trained: equal weights are not two untouched initialisations


SLURM_RANK = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1200",
              "SLURM_ARRAY_TASK_ID": "3", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0",
              "SLURM_JOB_NODELIST": "node7", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}


def test_slurm_ranks_rendezvous_on_a_port_of_their_task_below_the_ephemeral_range():
    """Every rank of an array task exports the same MASTER_PORT (from the task's id), below Linux's
    ephemeral ports; tasks of one array get ports of their own; a user's MASTER_PORT is kept."""
    from hpctrain.train import distributed
    from hpctrain.core.ports import MASTER_PORTS, job_master_port

    saved = dict(os.environ)  # submitit's export writes os.environ itself: all of it is put back after
    try:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
        os.environ.update(SLURM_RANK)
        distributed._export_from_submitit()
        port = int(os.environ["MASTER_PORT"])
        assert port == job_master_port("1200_3") and 20000 <= port < 32768 and MASTER_PORTS == range(20000, 32768)
        assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")] == ["1", "2", "node7"]
        assert len({job_master_port(f"1200_{t}") for t in range(100)}) >= 98  # the array's tasks spread out

        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
            del os.environ[key]
        os.environ["MASTER_PORT"] = "29555"
        distributed._export_from_submitit()
        assert os.environ["MASTER_PORT"] == "29555" and os.environ["RANK"] == "1"
    finally:
        os.environ.clear()
        os.environ.update(saved)
