"""What ran where (issue 30 item 5): each attempt records its node, GPU model, driver and CUDA versions, CPU model;
`report` and the API show it, and `report` warns in one line when the ranked runs trained on different GPU models.

GPUs are faked by a stub `pynvml` earlier on the job's PYTHONPATH (no code under test is edited): each job process
takes the next model of FAKE_NVML_MODELS, so the two runs of one sweep name different GPUs."""

import json
import re
import subprocess
import sys

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain

import hpctrain
from hpctrain.core import events
from hpctrain.core.state import EventKind

MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]

STUB = '''
import os

_DIR = os.environ["FAKE_NVML_DIR"]


def _take():
    """The next free model: one per process (a file created exclusively claims it)."""
    models = os.environ["FAKE_NVML_MODELS"].split(",")
    for i, name in enumerate(models):
        try:
            os.close(os.open(os.path.join(_DIR, f"taken-{i}"), os.O_CREAT | os.O_EXCL))
            return name
        except FileExistsError:
            continue
    return models[-1]


_MODEL = None


def nvmlInit():
    global _MODEL
    if _MODEL is None:
        _MODEL = _take()


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetUUID(handle):
    return f"GPU-fake-{handle}"


def nvmlDeviceGetName(handle):
    return _MODEL.encode()


def nvmlSystemGetDriverVersion():
    return "550.54.15"


def nvmlSystemGetCudaDriverVersion():
    return 12040
'''


def cpu_model_line():
    text = open("/proc/cpuinfo").read()
    return " ".join(re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE).group(1).split())


@pytest.fixture(scope="module")
def faked(tmp_path_factory):
    """A 2-point local sweep whose jobs see a fake NVML: each run a different GPU model."""
    where = tmp_path_factory.mktemp("hw")
    stub, claims = where / "stub", where / "claims"
    stub.mkdir()
    claims.mkdir()
    (stub / "pynvml.py").write_text(STUB)
    env = {"PYTHONPATH": f"{stub}:{HELPERS}", "FAKE_NVML_DIR": str(claims), "FAKE_NVML_MODELS": ",".join(MODELS),
           "CUDA_VISIBLE_DEVICES": "1"}  # the launcher pins each run to the fake GPU 1 (trained on CPU: device=cpu)
    sweep = where / "s"
    run_hpctrain(["-m", "lr=1e-3,1e-2", "max_steps=20", "device=cpu", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"],
                 cwd=where, env=env, timeout=300)
    return sweep, env


def test_each_attempt_records_gpu_driver_cuda_cpu_and_node_local(faked):
    sweep, _ = faked
    loaded = hpctrain.load(sweep)
    seen = set()
    for run in loaded.runs:
        (start,) = [e for e in events.events(run.run_dir) if e.kind is EventKind.STARTED]
        facts = start.data()["hardware"]
        assert facts["gpu_model"] in MODELS and facts["gpu_count"] == 1  # CUDA_VISIBLE_DEVICES=1: one of two
        assert facts["driver"] == "550.54.15" and facts["cuda_driver"] == "12.4"
        assert facts["cpu_model"] == cpu_model_line()
        assert facts["node"] == facts["host"] and facts["nodelist"] is None  # local: no Slurm node list
        assert facts["cuda"] is None and facts["absent"]["cuda"] == "torch is built without CUDA"  # the CPU wheel
        assert run.hardware == {**facts}  # the API: the latest attempt's, from metrics.json
        assert run.hardware_by_attempt == [facts]
        assert run.hosts == {0: facts["node"]}
        seen.add(facts["gpu_model"])
    assert seen == set(MODELS)
    frame = loaded.to_pandas()
    assert set(frame["gpu_model"]) == set(MODELS)
    assert list(frame["driver"]) == ["550.54.15"] * 2 and list(frame["cpu_model"]) == [cpu_model_line()] * 2
    assert list(frame["nodes"]) == [loaded.runs[0].hardware["node"]] * 2


def test_report_shows_the_hardware_and_warns_once_when_gpu_models_differ(faked):
    sweep, env = faked
    proc = run_hpctrain(["report", str(sweep)], cwd=sweep.parent, env=env)
    out = proc.stdout + proc.stderr
    warnings = [line for line in out.splitlines() if "different GPU models" in line]
    assert len(warnings) == 1, out
    assert warnings[0].startswith("warning: the ranked runs trained on different GPU models (")
    assert all(m in warnings[0] for m in MODELS) and "compares hardware as well as configs" in warnings[0]
    for m in MODELS:
        assert f"hardware: 1 run(s) on 1x {m} (driver 550.54.15, CUDA 12.4)" in out, out
    assert "Traceback" not in out
    csv = (sweep / "results.csv").read_text().splitlines()
    assert csv[0].split(",")[-3:] == ["gpu_model", "cpu_model", "nodes"]
    assert "## Hardware" in (sweep / "report.md").read_text()


def test_same_gpu_model_no_warning_and_cpu_models_compared_without_gpu():
    from hpctrain.review import hardware as ran_on

    class R:
        def __init__(self, idx, **hw):
            self.idx, self.hardware = idx, hw

    same = [R(0, gpu_model="NVIDIA H200"), R(1, gpu_model="NVIDIA H200"), R(2)]  # #2: no record yet
    assert ran_on.mixed_warning(same) is None
    cpus = [R(0, cpu_model="AMD EPYC"), R(1, cpu_model="Intel Xeon")]
    line = ran_on.mixed_warning(cpus)
    assert line is not None and "different CPU models" in line and "AMD EPYC: #0" in line
    assert ran_on.mixed_warning([R(0, cpu_model="AMD EPYC"), R(1, cpu_model="AMD EPYC")]) is None


def test_probe_on_a_cpu_machine_says_what_is_absent_without_error():
    from hpctrain.job import hardware as probe

    # a fresh interpreter without the stub: this machine's real NVML (none here) and the CPU wheel of torch
    code = "import json; from hpctrain.job import hardware; print(json.dumps(hardware.probe()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=hpctrain_env(),
                          check=True)
    facts = json.loads(done.stdout)
    assert set(probe.FIELDS) <= set(facts)
    assert facts["cpu_model"] == cpu_model_line()
    if facts["gpu_model"] is None:  # a machine without a GPU: every GPU field says why
        assert facts["absent"]["gpu_model"].startswith("no NVML") and facts["gpu_count"] == 0
        assert facts["driver"] is None and "driver" in facts["absent"]


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_each_rank_records_its_node_on_slurm_across_two_nodes(tmp_path):
    from slurm_helpers import run_dirs

    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=20", "hydra/launcher=slurm", "hydra.launcher.nodes=2",
                  "hydra.launcher.tasks_per_node=1", "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}"],
                 cwd=tmp_path, timeout=300)
    (run_dir,) = run_dirs(sweep)
    (start,) = [e for e in events.events(run_dir) if e.kind is EventKind.STARTED]
    facts = start.data()["hardware"]
    assert facts["nodelist"] == "n[1-2]" and facts["node"] in ("n1", "n2")
    assert facts["cpu_model"] == cpu_model_line() and facts["key"]  # the Slurm job and restart it ran in
    (run,) = hpctrain.load(sweep).runs
    assert run.state.value == "completed"
    assert run.hosts == {0: facts["node"], 1: ({"n1", "n2"} - {facts["node"]}).pop()}  # each rank its own node
    assert list(hpctrain.load(sweep).to_pandas()["nodes"]) == ["n1,n2"]
    out = run_hpctrain(["report", str(sweep)], cwd=tmp_path).stdout
    assert "hardware: 1 run(s) on CPU " in out and "; nodes n1, n2" in out, out
    assert "different" not in out
