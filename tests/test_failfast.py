"""Every bad input fails on the login node with a message naming the culprit; nothing is submitted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import hpctrain_env, run_hpctrain

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra

IMAGE_DIR = "__tmp__/not-an-image"  # placeholders filled in per test
CASES = [
    # config: keys, types, ranges
    (["lr=-1"], "lr=-1.0: expected a number > 0"),
    (["lr=abc"], "hpctrain: lr=abc: expected a number"),
    (["lr=1e-3,-2"], "run 1 (lr=-2): lr=-2.0: expected a number > 0"),
    (["max_steps=0"], "max_steps=0: expected an integer > 0"),
    (["max_steps=10,zz"], "hpctrain: max_steps=zz: expected an integer"),
    (["grad_accum=0"], "grad_accum=0: expected an integer >= 1"),
    (["precision=fp8"], "precision='fp8': expected one of 32, bf16, fp16"),
    (["batch_size=30", "grad_accum=4"], "batch_size=30: expected a multiple of world_size x grad_accum = 1 x 4"),
    (["batch_size=0"], "batch_size=0: expected an integer > 0"),
    (["nosuchkey=1"], "hpctrain: nosuchkey: no such key in the config"),
    (["model.nosuch=3"], "hpctrain: model.nosuch: no such key in the config (model has _target_, in_features, "),
    (["model=nosuch"], "hpctrain: model=nosuch: no such option of the config group 'model' (options: cnn, gpt, mlp)"),
    (["compile=maybe"], "hpctrain: compile=maybe: expected true or false"),
    (["log_every=0"], "log_every=0: expected an integer >= 1"),
    (["eval_batches=-1"], "eval_batches=-1: expected an integer >= 0 (0: the whole validation set)"),
    (["device=tpu"], "device='tpu': expected auto, cpu or cuda"),
    (["min_lr_ratio=2"], "min_lr_ratio=2.0: expected a number in [0, 1]"),
    (["schedule=[{step:5,batch_size:8}]"], "schedule[0].batch_size: cannot change during a run"),
    (["schedule=[{step:5,optim.momentum:0.5}]"], "schedule[0].optim.momentum: the optimizer's config has no 'momentum'"),
    (["model=gpt"], "model.vocab_size: Interpolation key 'data.vocab_size' not found"),
    # components: _target_ checked without importing it
    (["model._target_=nosuch_pkg.Net"], "model._target_='nosuch_pkg.Net': module 'nosuch_pkg' not found"),
    (["model._target_=hpctrain.train.models.mlp.Nope"], "module 'hpctrain.train.models.mlp' has no 'Nope'"),
    (["optim._target_=torch.optim.Adamm"], "optim._target_='torch.optim.Adamm': module 'torch.optim' has no 'Adamm'"),
    # the built-in models' sizes
    (["model.hidden=-3"], "model.hidden=-3: expected an integer >= 1"),
    (["model=cnn", "data=images", "model.width=0"], "model.width=0: expected an integer >= 1"),
    (["model=gpt", "data=tokens", "model.n_head=3"], "model.n_embd=128: expected a multiple of model.n_head=3"),
    # data
    (["data._target_=hpctrain.train.datasets.synthetic.nope"], "module 'hpctrain.train.datasets.synthetic' has no 'nope'"),
    (["data.train_size=16", "batch_size=64"], "batch_size=64: larger than data.train_size=16"),
    (["data.num_classes=0"], "data.num_classes=0: expected an integer >= 2"),
    (["data=images", "data.num_features=10"], "data.num_features=10: expected channels x image_size x image_size = 256"),
    # resources, asked of the cluster
    (["hydra.launcher.gpus_per_node=3"], "hydra.launcher.gpus_per_node=3: nodes of partition 'debug' have at most 2 GPU(s)"),
    (["hydra.launcher.partition=nosuch"], "hydra.launcher.partition='nosuch': no such partition"),
    (["hydra.launcher.partition=short", "hydra.launcher.timeout_min=100"],
     "hydra.launcher.timeout_min=100: partition 'short' allows at most 10"),
    (["hydra.launcher.nodes=3"], "hydra.launcher.nodes=3: partition 'debug' has 2 node(s)"),
    (["hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=2"],
     "tasks_per_node x cpus_per_task = 4 CPUs: nodes of partition 'debug' have at most 2"),
    (["hydra.launcher.mem_gb=100"], "hydra.launcher.mem_gb=100.0: nodes of partition 'debug' have at most 3.9 GB"),
    (["hydra.launcher.nodes=2", "batch_size=63"], "batch_size=63: expected a multiple of world_size x grad_accum = 2 x 1"),
    (["hydra.launcher.timeout_min=0"], "hydra.launcher.timeout_min=0: expected an integer > 0"),
    (["hydra.launcher.max_retries=-1"], "hydra.launcher.max_retries=-1: expected an integer >= 0"),
    # packing (runs_per_task)
    (["hydra.launcher.runs_per_task=0"], "hydra.launcher.runs_per_task=0: expected an integer >= 1"),
    (["hydra.launcher.runs_per_task=2", "hydra.launcher.tasks_per_node=2"],
     "hydra.launcher.runs_per_task=2: only single-rank runs can be packed; these runs have 2 ranks"),
    (["hydra.launcher.runs_per_task=4", "hydra.launcher.nodes=2"],
     "hydra.launcher.runs_per_task=4: only single-rank runs can be packed; these runs have 2 ranks"),
    (["hydra.launcher.runs_per_task=2", "hydra.launcher.gpu_memory_fraction=1.5"],
     "hydra.launcher.gpu_memory_fraction=1.5: expected a number in (0, 1]"),
    # container
    (["hydra.launcher.container.image=/nonexistent/img.sif"], "hydra.launcher.container.image='/nonexistent/img.sif': file not found"),
    (["hydra.launcher.container.image=__tmp__"], "not a readable file or sandbox directory"),
    (["hydra.launcher.container.image=__img__", "hydra.launcher.container.binds=[/nonexistent/data]"],
     "source path '/nonexistent/data' does not exist"),
    (["hydra.launcher.container.image=__img__", "hydra.launcher.container.runtime=docker"],
     "hydra.launcher.container.runtime='docker': expected one of apptainer, singularity"),
    # paths and secrets
    (["hydra.sweep.dir=/etc/hostname/sweep"], "hydra.sweep.dir='/etc/hostname/sweep': cannot be written"),
    (["+hydra.launcher.env.MY_API_TOKEN=abc"], "hydra.launcher.env.MY_API_TOKEN: looks like a secret"),
]


def _my_jobs(cwd) -> set:
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()[-1] == str(cwd)}


# Every case in ONE interpreter (a fresh Hydra per case), as `python -m hpctrain` would run it: a case is
# config and cluster queries only, so nothing carries over but the imports, which a case pays once.
DRIVER = """
import contextlib, io, json, sys, time
from hydra.core.global_hydra import GlobalHydra
from hpctrain.__main__ import main

results = []
for argv in json.loads(sys.argv[1]):
    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    start = time.time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(), "elapsed": time.time() - start})
print(json.dumps(results))
"""


def _case_args(args, work: Path, case: int) -> "tuple[list, Path]":
    case_dir = work / f"case{case}"
    case_dir.mkdir()
    image = case_dir / "img.sif"
    image.write_text("not really an image")
    args = [a.replace("__tmp__", str(case_dir)).replace("__img__", str(image)) for a in args]
    sweep = case_dir / "sweep"
    if not any(a.startswith("hydra.sweep.dir=") for a in args):
        args.append(f"hydra.sweep.dir={sweep}")
    return ["-m", *args, "hydra/launcher=slurm"], sweep


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("failfast")
    cases = [_case_args(args, work, i) for i, (args, _) in enumerate(CASES)]
    # two interpreters, half of the cases each: the machine's second core would otherwise sit idle
    halves = [cases[:len(cases) // 2], cases[len(cases) // 2:]]
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps([argv for argv, _ in half])], cwd=work,
                              env=hpctrain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for half in halves]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results += json.loads(out.splitlines()[-1])
    assert len(results) == len(cases)
    jobs = _my_jobs(work)
    return {i: (result, sweep, jobs) for i, (result, (_, sweep)) in enumerate(zip(results, cases))}


@pytest.mark.slurm
@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_fails_fast_and_submits_nothing(outcomes, case):
    result, sweep, jobs = outcomes[case]
    message = CASES[case][1]
    assert result["rc"] != 0, result
    assert message in result["stderr"], result["stderr"]
    assert "Traceback" not in result["stderr"]
    assert not (sweep / ".submitit").exists() and not (sweep / "sweep.json").exists()
    # no run directory (Hydra's own multirun.yaml may be there): glob finds nothing in an absent dir too
    assert [p.name for p in sweep.glob("*") if p.is_dir() and not p.name.startswith(".")] == []
    assert not list(sweep.glob("**/metrics.json"))
    assert not jobs, f"a job was submitted: {jobs}"
    assert result["elapsed"] < 10, f"took {result['elapsed']:.1f} s to fail"


def test_one_bad_input_in_its_own_interpreter(tmp_path):
    """The case table runs in one interpreter: this one runs as a user does, a fresh `python -m hpctrain`."""
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,-2", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                        check=False, timeout=60)
    assert proc.returncode != 0 and "run 1 (lr=-2): lr=-2.0: expected a number > 0" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (sweep / "sweep.json").exists()


def test_all_bad_points_reported_together(tmp_path):
    proc = run_hpctrain(["-m", "lr=1e-3,-1", "max_steps=0,5", "hydra/launcher=local", f"hydra.sweep.dir={tmp_path / 's'}"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("run ")]
    assert lines == [
        "run 0 (lr=0.001 max_steps=0): max_steps=0: expected an integer > 0",
        "run 2 (lr=-1 max_steps=0): lr=-1.0: expected a number > 0",
        "run 2 (lr=-1 max_steps=0): max_steps=0: expected an integer > 0",
        "run 3 (lr=-1 max_steps=5): lr=-1.0: expected a number > 0",
    ]
    assert not (tmp_path / "s" / ".submitit").exists()
