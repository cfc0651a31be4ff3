"""What accounting says a job cost: sacct's AllocTRES x elapsed, every attempt (hpctrain/slurm parse + query)."""

import subprocess
import time

import pytest

from hpctrain.slurm import parse as slurm_parse
from hpctrain.slurm import query as slurm

# lines as production clusters print them (sacct -n -P -X -D -o JobID,State,ElapsedRaw,AllocTRES,Start,End)
PRODUCTION = """\
7001_0|COMPLETED|3600|billing=16,cpu=16,gres/gpu:a100=2,gres/gpu=2,mem=125G,node=1|2026-11-20T10:00:00|2026-11-20T11:00:00
7001_1|PREEMPTED|1800|billing=8,cpu=8,gres/gpu:h100=1,mem=64G,node=1|2026-11-20T10:00:00|2026-11-20T10:30:00
7001_1|COMPLETED|3600|billing=8,cpu=8,gres/gpu:h100=1,mem=64G,node=1|2026-11-20T10:31:00|2026-11-20T11:31:00
7001_[2-3%2]|PENDING|0|billing=4,cpu=4,mem=16G,node=1|Unknown|Unknown
7002|CANCELLED by 1000|60|billing=1,cpu=1,mem=500M,node=1|2026-11-20T10:00:00|2026-11-20T10:01:00
7003|FAILED|
garbage line
"""


def test_attempts_gpus_and_cpus_from_production_lines():
    rows, unreadable = slurm_parse.parse_usage(PRODUCTION)
    assert unreadable == 2  # a line cut short and one that is no sacct line: left out, not guessed
    by_id = {}
    for row in rows:
        by_id.setdefault(row.job_id, []).append(row)
    assert by_id["7001_0"][0].gpus == 2 and by_id["7001_0"][0].gpu_hours == pytest.approx(2.0)
    assert [r.state for r in by_id["7001_1"]] == ["PREEMPTED", "COMPLETED"]  # both attempts count
    assert sum(r.gpu_hours for r in by_id["7001_1"]) == pytest.approx(1.5)  # typed only: summed
    assert by_id["7001_2"][0].start is None and by_id["7001_3"][0].elapsed_s == 0
    assert by_id["7002"][0].state == "CANCELLED" and by_id["7002"][0].cpu_hours == pytest.approx(1 / 60)


def test_tres_counts_take_the_total_over_typed_entries():
    assert slurm_parse.tres_counts("cpu=4,gres/gpu:a100=2,gres/gpu=2,mem=16G") == {"cpu": 4, "gpu": 2}
    assert slurm_parse.tres_counts("cpu=4,gres/gpu:a100=2,gres/gpu:v100=1") == {"cpu": 4, "gpu": 3}
    assert slurm_parse.tres_counts("billing=1,cpu=1,mem=500M,node=1") == {"cpu": 1, "node": 1, "gpu": 0}


@pytest.mark.slurm
def test_the_test_cluster_accounts_gpus_and_every_attempt(slurm_cluster, tmp_path):
    job = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=1", "-c", "1", "-o", str(tmp_path / "%j.out"),
                          "--wrap", "sleep 3"], capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.time() + 60
    while time.time() < deadline and subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                                                    text=True).stdout.strip():
        time.sleep(0.5)
    answer = None
    while time.time() < deadline:  # the end reaches slurmdbd a moment after the queue
        answer = slurm.usage([job])
        if answer and answer[0] and answer[0][-1].state == "COMPLETED":
            break
        time.sleep(0.5)
    assert answer is not None
    rows, unreadable = answer
    assert unreadable == 0 and [r.state for r in rows] == ["COMPLETED"], rows
    assert rows[0].gpus == 1 and rows[0].cpus == 1 and rows[0].elapsed_s >= 2


def test_total_line_splits_gpu_hours_by_state_and_low_utilisation_is_flagged():
    from types import SimpleNamespace

    from hpctrain.core.state import State
    from hpctrain.review import cost

    cost_of = {0: cost.Cost(2.0, 16.0, 3600, 1, False), 1: cost.Cost(0.5, 4.0, 900, 2, False)}
    rows = [SimpleNamespace(idx=0, state=State.COMPLETED, utilisation={"gpu_util_mean": 85.0}, cost=cost_of[0]),
            SimpleNamespace(idx=1, state=State.FAILED, utilisation={"gpu_util_mean": 7.5, "gpu_mem_peak_gb": 3.2},
                            cost=cost_of[1]),
            SimpleNamespace(idx=2, state=State.CANCELLED, utilisation={}, cost=None)]
    assert cost.total_line(rows) == "GPU-hours: 2.5 (completed 2, failed 0.5), CPU-hours: 20"
    assert cost.shown(cost_of[1]) == "0.5" and cost.shown(None) == "-"
    assert cost.shown(cost.Cost(0.25, 1, 1, 1, True)) == "~0.25"
    assert cost.low_utilisation(rows) == ["#1: GPUs 8 % busy on average, peak memory 3.2 GB: a smaller allocation "
                                          "or more runs per GPU (hydra.launcher.runs_per_task) would do"]
