"""torch's private names (torch.distributed). Imported only from hpctrain.train: it loads torch.

When a release moves one of these, this module is the one to change (canaries: tests/test_compat_heavy.py).
"""


def abort_process_groups() -> None:
    """Abort every process group (NCCL: the communicators are aborted, nothing waits on the peers)."""
    import torch.distributed as dist

    dist.distributed_c10d._abort_process_group()  # private (torch >= 2.5)
