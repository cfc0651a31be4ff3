"""Where am I: torchrun, a submitit job (Slurm or local), or a single process.

Rank, world size, master address and a port that every rank agrees on come from torchrun's
variables, or from submitit's ``TorchDistributedEnvironment`` (first host of the Slurm node list as
master, a port derived from the job id). gloo on CPU, NCCL on CUDA.
"""

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
        return self.world_size > 1


def _export_from_submitit() -> None:
    """Fill RANK/WORLD_SIZE/MASTER_* from the submitit job environment (Slurm or local)."""
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device=cuda but torch sees no CUDA device")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_distributed(device_preference: str = "auto", timeout_s: float = 600.0) -> DistInfo:
    if "RANK" not in os.environ and os.environ.get("SUBMITIT_EXECUTOR"):
        _export_from_submitit()
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_preference, local_rank)
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


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when ``flag`` is true on at least one (a collective: call on all ranks)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
