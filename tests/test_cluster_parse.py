"""cluster.py's parsers on lines recorded from production clusters (../shared/notes/real-cluster-output.md)."""

import pytest

from hpctrain.slurm import parse as slurm_parse, query as slurm

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra

NODES = """\
NodeName=gpu001 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUEfctv=64 CPUTot=64 CPULoad=12.02 AvailableFeatures=a100,ib ActiveFeatures=a100,ib Gres=gpu:a100:4(S:0-1) NodeAddr=gpu001 NodeHostName=gpu001 Version=23.02.7 RealMemory=515000 AllocMem=128000 FreeMem=310211 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Partitions=gpu,preempt CfgTRES=cpu=64,mem=515000M,billing=64,gres/gpu=4 AllocTRES=cpu=16,mem=125G,gres/gpu=1
NodeName=gpu101 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot=96 Gres=gpu:h100:8(S:0-1),shard:h100:32(S:0-1) RealMemory=2000000 State=IDLE Partitions=gpu-h100 CfgTRES=cpu=96,mem=2000000M,gres/gpu=8,gres/shard=32
NodeName=mig01 CPUTot=64 Gres=gpu:1g.10gb:14(S:0),gpu:3g.40gb:2(S:1) RealMemory=500000 State=IDLE Partitions=mig
NodeName=gpu201 CPUTot=32 Gres=gpu:4(S:0) RealMemory=192000 State=DRAIN+DRAIN Reason=ECC errors [root@2026-11-20T10:11:12] Partitions=gpu
NodeName=cpu0042 CPUTot=128 Gres=(null) RealMemory=257000 State=ALLOCATED Partitions=cpu
"""
PARTITIONS = """\
PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=NO QoS=N/A DefaultTime=01:00:00 MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 Nodes=gpu[001-016],gpu[201-204] PriorityTier=1 State=UP TotalCPUs=1152 TotalNodes=20 DefMemPerCPU=7800 MaxMemPerNode=UNLIMITED TRES=cpu=1152,mem=9000G,node=20,gres/gpu=80
PartitionName=preempt Default=YES MaxTime=UNLIMITED Nodes=gpu[001-016],cpu[0001-0128] PreemptMode=REQUEUE State=UP
PartitionName=debug Default=NO MaxTime=30:00 Nodes=cpu[0001-0004] State=UP
"""
CONFIG = """\
Configuration data as of 2026-12-01T07:00:00
MaxArraySize            = 1001
MaxJobCount             = 10000
SchedulerParameters     = bf_continue,bf_max_job_test=500,max_array_tasks=1000
"""


@pytest.mark.parametrize("text, expected", [
    ("gpu:a100:4(S:0-1)", [slurm_parse.Gres("gpu", "a100", 4, "0-1")]),
    ("gpu:4(S:0)", [slurm_parse.Gres("gpu", None, 4, "0")]),
    ("gpu:2", [slurm_parse.Gres("gpu", None, 2)]),
    ("gpu:tesla:2(S:0)", [slurm_parse.Gres("gpu", "tesla", 2, "0")]),
    ("gpu:h100:8(S:0-1),shard:h100:32(S:0-1)",
     [slurm_parse.Gres("gpu", "h100", 8, "0-1"), slurm_parse.Gres("shard", "h100", 32, "0-1")]),
    ("gpu:h100:8(S:0-1),shard:16", [slurm_parse.Gres("gpu", "h100", 8, "0-1"), slurm_parse.Gres("shard", None, 16)]),
    ("gpu:1g.10gb:14(S:0),gpu:3g.40gb:2(S:1)",
     [slurm_parse.Gres("gpu", "1g.10gb", 14, "0"), slurm_parse.Gres("gpu", "3g.40gb", 2, "1")]),
    ("gpu:a100:4(S:0,1)", [slurm_parse.Gres("gpu", "a100", 4, "0,1")]),
    ("(null)", []),
    ("", []),
])
def test_gres_forms(text, expected):
    assert slurm_parse.parse_gres(text) == expected


def test_gpu_count_leaves_out_shards_and_sums_mig_profiles():
    assert slurm_parse.gpu_count("gpu:h100:8(S:0-1),shard:h100:32(S:0-1)") == 8
    assert slurm_parse.gpu_count("gpu:1g.10gb:14(S:0),gpu:3g.40gb:2(S:1)") == 16
    assert slurm_parse.gpu_count("(null)") == 0


@pytest.mark.parametrize("text, expected", [
    ("gpu[001-003],gpu[201-202]", ["gpu001", "gpu002", "gpu003", "gpu201", "gpu202"]),
    ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
    ("node17", ["node17"]),
    ("a,b", ["a", "b"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("(null)", []),
])
def test_nodelists(text, expected):
    assert slurm_parse.expand_nodelist(text) == expected


def test_nodelist_sizes_of_the_recorded_partitions():
    assert len(slurm_parse.expand_nodelist("gpu[001-016],gpu[201-204]")) == 20
    assert len(slurm_parse.expand_nodelist("gpu[001-016],cpu[0001-0128]")) == 144


@pytest.mark.parametrize("text, minutes", [
    ("UNLIMITED", None), ("INFINITE", None), ("30", 30), ("30:00", 30), ("30:30", 31), ("01:00:00", 60),
    ("2-00:00:00", 2880), ("1-12", 2160), ("1-12:30", 2190), ("1-00:00:01", 1441), ("0:45", 1),
])
def test_time_limits(text, minutes):
    assert slurm_parse.time_limit_minutes(text) == minutes


def test_bad_time_limit_raises():
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        slurm_parse.time_limit_minutes("soon")


def test_nodes_and_partitions_as_production_prints_them():
    parts = slurm_parse.parse_partitions(PARTITIONS, NODES)
    assert parts["gpu"].max_time_min == 2880 and parts["debug"].max_time_min == 30
    assert parts["preempt"].default and parts["preempt"].max_time_min is None
    gpu = {n.name: n for n in parts["gpu"].nodes}
    assert set(gpu) == {"gpu001", "gpu201"}  # only nodes scontrol printed
    assert gpu["gpu001"].gpus == 4 and gpu["gpu001"].cpus == 64 and gpu["gpu001"].mem_mb == 515000
    assert gpu["gpu201"].state == "DRAIN+DRAIN" and gpu["gpu201"].gpus == 4
    node = slurm_parse.parse_node(NODES.splitlines()[3])
    assert node is not None and node.name == "gpu201"
    assert slurm_parse.parse_fields(NODES.splitlines()[3])["Reason"] == "ECC errors [root@2026-11-20T10:11:12]"


def test_array_limits():
    limits = slurm_parse.array_limits_from(slurm_parse.parse_config(CONFIG))
    assert limits == slurm_parse.ArrayLimits(1001, 1000) and limits.tasks_per_array == 1000
    assert slurm_parse.array_limits_from({}).tasks_per_array == 1001
    assert slurm_parse.array_limits_from({"MaxArraySize": "garbage"}).max_array_size == 1001


def test_job_ids():
    assert slurm_parse.split_job_id("123_4") == ("123", "4")
    assert slurm_parse.split_job_id("123") == ("123", None)
    assert slurm_parse.expand_array_ids("14_[1-3,7%2]") == ["14_1", "14_2", "14_3", "14_7"]
    assert slurm_parse.array_ids(["5_1", "5_2", "6", None]) == ["5", "6"]


def test_poller_rides_out_failures_and_says_so(capsys):
    answers = iter([{"1": ("RUNNING", "None")}, None, None, None, {}])
    poller = slurm.Poller(lambda: next(answers), "squeue", patience=5)
    assert poller.poll() == {"1": ("RUNNING", "None")}
    assert poller.poll() == {"1": ("RUNNING", "None")} and poller.unknown
    assert poller.poll() == {"1": ("RUNNING", "None")}
    assert "squeue failed 2 times in a row" in capsys.readouterr().err
    poller.poll()
    assert poller.poll() == {} and not poller.unknown
    assert "answers again after 3 failed calls" in capsys.readouterr().err


def test_poll_squeue_asks_often_at_first_then_less_often(monkeypatch):
    """A wait that ends at once is seen at once; a long one asks once per max_interval_s. A failed call in
    between never ends the wait."""
    clock = [0.0]
    pauses = []
    answers = iter([{"1_0": ("RUNNING", "None")}] * 40 + [None] + [{"1_0": ("RUNNING", "None")}] * 9 + [{}])
    monkeypatch.setattr(slurm, "squeue", lambda ids: next(answers))
    monkeypatch.setattr(slurm.time, "monotonic", lambda: clock[0])

    def sleep(s: float) -> None:
        pauses.append(s)
        clock[0] += s

    monkeypatch.setattr(slurm.time, "sleep", sleep)
    queue = slurm.poll_squeue(["1"], 10.0, lambda q: not q)  # done once the queue holds none of them
    assert queue == {} and len(pauses) == 50
    assert pauses[:5] == [0.25, 0.375, 0.5625, 0.84375, 1.0]  # a job that ends at once is seen at once
    slower = next(i for i, p in enumerate(pauses) if p > 1.0)
    assert set(pauses[4:slower]) == {1.0} and 30.0 < sum(pauses[:slower]) <= 31.0  # then every second for 30 s
    assert pauses[slower:slower + 3] == [1.5, 2.25, 3.375] and max(pauses) == 10.0 and pauses[-1] == 10.0
