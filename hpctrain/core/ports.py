"""The rendezvous port of a job's ranks (torch.distributed's MASTER_PORT), without torch: the search
worker derives its trials' ports from it too."""

import random

# Below Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999), from which the kernel
# gives out the local ports of connections: gloo's and NCCL's own links, other jobs' sockets on the node.
MASTER_PORTS = range(20000, 32768)


def job_master_port(job_id: str) -> int:
    """The rendezvous port of a job's ranks: each rank computes the same one from the job id (an array
    task's own, ``123_4``; a requeue keeps it). submitit's pick (20000-60000) lies mostly in the ephemeral
    range, where a port some connection holds fails ``init_process_group`` with EADDRINUSE on every attempt
    (seen on the test cluster: both attempts of a two-rank run, with other gloo runs on the same host)."""
    return random.Random(str(job_id)).choice(MASTER_PORTS)
