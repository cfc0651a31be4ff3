"""Where am I: torchrun, a submitit job (Slurm or local), or a single process; which GPU is mine.

Rank, world size, master address and a port that every rank agrees on come from torchrun's
variables, or from submitit's ``TorchDistributedEnvironment`` (first host of the Slurm node list as
master, and a port derived from the job id below the ephemeral range). gloo on CPU, NCCL on CUDA.

GPU code has never run on this project's CI, so wrong states fail loudly here: a job that was given
GPUs but sees no CUDA stops instead of training on CPU, and two ranks are never mapped onto one GPU.
``device_count`` and ``cuda_available`` are the only CUDA queries: tests replace them at this seam.
"""

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

import torch
import torch.distributed as dist

from hpctrain._compat.torch import abort_process_groups
from hpctrain.core.ports import job_master_port

log = logging.getLogger(__name__)

# Variables through which a job is handed GPUs (Slurm's, and the CUDA runtime's own)
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
# values that mean "no GPU" (Slurm writes NoDevFiles when a job asked for none on a GPU node)
_NO_GPU = ("", "-1", "NoDevFiles", "none")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """More than one rank."""
        return self.world_size > 1


def cuda_available() -> bool:
    return torch.cuda.is_available()


def device_count() -> int:
    return torch.cuda.device_count()


def _ids(value: Optional[str]) -> List[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def gpus_given(env: Mapping[str, str]) -> Optional[str]:
    """``NAME=value`` of the first variable saying this job was handed GPUs, else None."""
    for name in GPU_ENV:
        value = env.get(name, "").strip()
        if value not in _NO_GPU and not (name == "SLURM_GPUS_ON_NODE" and value == "0"):
            return f"{name}={value}"
    return None


def device_index(local_rank: int, local_world_size: int, n_visible: int, env: Mapping[str, str]) -> int:
    """This rank's CUDA device among the ``n_visible`` it sees, such that no two ranks share one.

    Either every rank of the node sees all the node's GPUs (index = local rank, which must be below the
    count), or each task was bound to its own subset (``--gpus-per-task``, ``--gpu-bind``: fewer visible
    than the step's GPUs on this node, enough for every task), and takes the first of its own.
    """
    if local_rank < n_visible and local_world_size <= n_visible:
        return local_rank
    # the node's GPU count: with --gpus-per-task, SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES are the task's own
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    node_gpus = int(on_node) if on_node.isdigit() else len(_ids(env.get("SLURM_JOB_GPUS")))
    if 0 < n_visible < node_gpus and n_visible * local_world_size <= node_gpus:
        return 0
    raise RuntimeError(
        f"local rank {local_rank} of {local_world_size} task(s) on this node sees {n_visible} CUDA device(s) "
        f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')}): ranks would share a GPU; "
        f"ask for at least as many GPUs as tasks per node (hydra.launcher.gpus_per_node >= tasks_per_node)"
    )


def pick_device(preference: str, local_rank: int, local_world_size: int = 1,
                env: Optional[Mapping[str, str]] = None) -> torch.device:
    env = os.environ if env is None else env
    if preference == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        given = gpus_given(env)
        if preference == "auto" and given is None:
            return torch.device("cpu")
        why = f"the job was given GPUs ({given})" if given else "device=cuda"
        raise RuntimeError(
            f"{why} but torch sees no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}): "
            f"check the driver, `--nv` for a container, CUDA_VISIBLE_DEVICES; device=cpu to train on CPU"
        )
    index = device_index(local_rank, local_world_size, device_count(), env)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def allow_tf32(device: torch.device) -> None:
    """fp32 matmuls on TF32 tensor cores on CUDA (Ampere and later), as nanoGPT and torchtitan do: full
    FP32 runs them several times slower. cuDNN convolutions use TF32 by default already; bf16/fp16
    autocast regions are not affected."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


def _export_from_submitit() -> None:
    """Fill RANK/WORLD_SIZE/LOCAL_*/MASTER_* from the submitit job environment (Slurm or local); the port
    is :func:`job_master_port` unless the user set MASTER_PORT."""
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    env = TorchDistributedEnvironment()  # it takes a MASTER_PORT already set as its port
    if "MASTER_PORT" not in os.environ:
        env.master_port = job_master_port(JobEnvironment().job_id)
    env.export(set_cuda_visible_devices=False, overwrite=True)  # (without overwrite, a set one is an error)


def ranks() -> "tuple[int, int]":
    """This process's (rank, local rank), before any process group (submitit's variables exported first)."""
    if "RANK" not in os.environ and os.environ.get("SUBMITIT_EXECUTOR"):
        _export_from_submitit()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


def init_distributed(device_preference: str = "auto", timeout_s: float = 600.0) -> DistInfo:
    rank, local_rank = ranks()
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device = pick_device(device_preference, local_rank, local_world_size)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def teardown(failed: bool = False) -> None:
    """Leave the process group. After a failure, never wait on the other ranks: NCCL's finalize can block
    forever on a peer that died (PyTorch expects a hang there), so the communicators are aborted."""
    if not dist.is_initialized():
        return
    if not failed:
        dist.destroy_process_group()
        return
    if dist.get_backend() != "nccl":
        dist.destroy_process_group()  # gloo's does not wait on the peers
        return
    try:
        abort_process_groups()  # abort, do not finalize
    except Exception as exc:  # noqa: BLE001 - on the error path already; the process exits next
        log.warning("could not abort the NCCL process group: %s", exc)


class AgreedFlag:
    """A flag all ranks agree on one step after any rank raised it, with no blocking collective per step.

    Each step's local value is all-reduced (MAX) asynchronously and read at the next step, by which time
    the reduction has long finished (DDP's gradient all-reduce keeps the ranks within a step of each other).
    The flag travels as a CPU tensor (over a gloo group beside an NCCL one): reading it never waits on the GPU.
    Every rank must call :meth:`exchange` once per step and :meth:`drain` once at the end.
    """

    def __init__(self, info: DistInfo) -> None:
        self.enabled = info.enabled
        self._group = None
        if self.enabled and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # a collective: every rank builds the trainer
        self._buf = torch.zeros(1)
        self._work: Optional[Any] = None

    def exchange(self, local: bool) -> bool:
        """Whether any rank's flag was up at the previous call; sends this rank's ``local`` for the next one."""
        if not self.enabled:
            return local
        agreed = False
        if self._work is not None:
            self._work.wait()
            agreed = bool(self._buf[0] > 0)
        self._buf[0] = 1.0 if local else 0.0
        self._work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return agreed

    def drain(self) -> None:
        """Wait for the reduction in flight (before the loop's end: none may outlive the process group)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
