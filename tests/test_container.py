"""The Apptainer image recipe, the test image built from it, and the container path of a sweep for real on
the Slurm test cluster.

Apptainer cannot be installed here: tests/container/build_image.py builds a sandbox image from
Singularity.def on Debian, and a stand-in `apptainer` (tests/container/apptainer, bubblewrap) placed first
on PATH runs it in real isolation: the job sees the image and its binds, not the host's Slurm client. Slurm
passes the submitting environment, PATH included, to the job, so the srun line's
`apptainer exec ... IMAGE python ...` reaches the stand-in on the compute node.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from spython.main.parse.parsers import SingularityParser

from cli_helpers import ROOT, run_hpctrain
from container_helpers import STANDIN, apptainer, sandbox_image, standin_bin
from hpctrain.submit.container import check_container

DEF_FILE = ROOT / "Singularity.def"
# Official PyTorch images: pytorch/pytorch:<torch>-cuda<X.Y>-cudnn<N>-runtime
PYTORCH_RUNTIME_TAG = re.compile(r"^pytorch/pytorch:(?P<torch>\d+\.\d+\.\d+)-cuda(?P<cuda>\d+\.\d+)-cudnn\d+-runtime$")
WEIRD = "a b;$(touch pwned)"  # a space, a command separator and a command substitution


# ---------------------------------------------------------------------------------------- the recipe
class _Parser(SingularityParser):
    """spython's parser, keeping the %test section's own lines (spython turns them into echo lines)."""

    test_lines: List[str] = []

    def _test(self, lines):
        self.test_lines = list(lines)
        super()._test(lines)


@pytest.fixture(scope="module")
def recipe():
    parser = _Parser(str(DEF_FILE))
    layers = parser.recipe
    assert list(layers) == ["spython-base"], f"expected one stage, got {list(layers)}"
    return parser, layers["spython-base"]


def _pyproject_dependencies() -> List[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _pyproject_image_extras() -> List[str]:
    """Optional dependencies the image carries too: every extra but the test tools."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    return [spec for name, specs in extras.items() if name != "test" for spec in specs]


def _pip_installs(install_lines: List[str]) -> List[List[str]]:
    """argv of every `python -m pip install ...` in %post (backslash continuations joined)."""
    script = "\n".join(line for line in install_lines if not line.endswith(">> /tests.sh"))
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv[:4] == ["python", "-m", "pip", "install"]:
            commands.append(argv[4:])
    return commands


def test_recipe_bootstraps_from_a_pytorch_cuda_runtime_image_in_range(recipe):
    _, r = recipe
    first = next(line.strip() for line in DEF_FILE.read_text().splitlines() if line.strip() and
                 not line.lstrip().startswith("#"))
    assert first == "Bootstrap: docker"
    match = PYTORCH_RUNTIME_TAG.match(r.fromHeader)
    assert match, f"From: {r.fromHeader!r} is not an official pytorch/pytorch CUDA runtime tag"
    (torch_range,) = [Requirement(d).specifier for d in _pyproject_dependencies() if Requirement(d).name == "torch"]
    assert Version(match["torch"]) in torch_range, f"image torch {match['torch']} is outside pyproject's {torch_range}"
    labels = dict(line.split(None, 1) for line in r.labels)
    assert labels["torch.version"] == match["torch"] and labels["cuda.version"] == match["cuda"]


def test_recipe_installs_exactly_pyprojects_pins_and_keeps_the_images_torch(recipe):
    _, r = recipe
    installs = _pip_installs(r.install)
    assert installs, "no `python -m pip install` in %post"
    specs, paths = [], []
    for argv in installs:
        skip = False
        for arg in argv:
            if skip:
                skip = False
            elif arg in ("-c", "--constraint", "-r", "--requirement"):
                skip = True
            elif not arg.startswith("-"):
                (paths if arg.startswith("/") or arg.startswith(".") else specs).append(arg)
    # identical text, read from pyproject.toml now: a pin changed there must be changed here too
    pins = [d for d in _pyproject_dependencies() if Requirement(d).name != "torch"] + _pyproject_image_extras()
    assert sorted(specs) == sorted(pins), f"%post installs {sorted(specs)}; pyproject.toml pins {sorted(pins)}"
    assert not any(Requirement(s).name == "torch" for s in specs), "torch must come from the base image"
    # the dependency install is constrained to the image's torch; hpctrain itself goes in without resolving
    dep_install = next(argv for argv in installs if any(not a.startswith(("-", "/")) for a in argv))
    assert "-c" in dep_install or "--constraint" in dep_install
    hpctrain_install = next(argv for argv in installs if "/opt/hpctrain" in argv)
    assert "--no-deps" in hpctrain_install
    assert any("torch.__version__" in line and "constraint" in line for line in r.install)


def _apt_installs(install_lines: List[str]) -> List[str]:
    packages = []
    for line in install_lines:
        if not line.strip().startswith("apt-get install"):
            continue
        argv = shlex.split(line, comments=True)
        if argv[:2] == ["apt-get", "install"]:
            packages += [a for a in argv[2:] if not a.startswith("-")]
    return packages


def test_recipe_adds_a_c_compiler_and_rdma(recipe):
    """torch.compile needs a C compiler at run time (Triton's launcher, Inductor on CPU), which the runtime
    image lacks; NCCL needs libibverbs and a provider to use InfiniBand/RoCE between nodes."""
    _, r = recipe
    packages = _apt_installs(r.install)
    assert {"gcc", "g++", "libc6-dev"} <= set(packages), packages
    assert {"rdma-core", "libibverbs1", "ibverbs-providers"} <= set(packages), packages
    assert any(line.strip() == "apt-get update" for line in r.install)
    assert any("optuna" in spec for argv in _pip_installs(r.install) for spec in argv)  # the search sweeper


def test_recipe_test_section_compiles_a_function_and_runs_here(recipe):
    """%test's own script, run with this environment's python: it must compile a function for real."""
    parser, _ = recipe
    assert any("torch.compile(" in line for line in parser.test_lines)
    # spython strips indentation: the script is taken from the file itself
    section = DEF_FILE.read_text().split("\n%test\n", 1)[1]
    script = section.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    assert "torch.compile(" in script
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.compile on cpu: ok" in proc.stdout


def test_recipe_copies_the_project_and_runs_hpctrain(recipe):
    parser, r = recipe
    sources = {line.split()[0]: line.split()[1] for line in r.files}
    # what the package needs, and nothing more (not `.`, which would take .venv and .git)
    assert set(sources) == {"pyproject.toml", "README.md", "hpctrain", "hydra_plugins", "conf"}, sources
    for src, dest in sources.items():  # every line: a tracked path of this repo, to the same name in /opt/hpctrain
        assert dest == f"/opt/hpctrain/{src}", (src, dest)
        tracked = subprocess.run(["git", "ls-files", "--", src], cwd=ROOT, capture_output=True, text=True).stdout
        assert tracked.strip(), f"%files copies {src}, which git does not track"
    assert r.cmd == 'exec python -m hpctrain "$@"'
    env = dict(line.split("=", 1) for line in r.environ if " " not in line.split("=", 1)[0])
    assert env.get("PYTHONUNBUFFERED") == "1"
    test = "\n".join(parser.test_lines)
    assert re.search(r"^import torch$", test, re.M) and re.search(r"^import hpctrain$", test, re.M)
    assert "torch.cuda.is_available()" in test and "torch.__version__" in test
    text = DEF_FILE.read_text()
    for section in ("%files", "%post", "%environment", "%runscript", "%test", "%labels", "%help"):
        assert re.search(rf"^{section}\s*$", text, re.M), f"no {section} section"


# ------------------------------------------------------------------ the test image and the stand-in
@pytest.fixture(scope="module")
def image() -> Path:
    return sandbox_image()


def _inside(image: Path, cwd: Path, *command: str, opts: Sequence[str] = (), env: Optional[Dict[str, str]] = None):
    return apptainer(["exec", *opts, str(image), *command], cwd=cwd, env=env)


def test_the_image_is_built_from_the_recipe(image):
    meta = image / ".singularity.d"
    assert (meta / "Singularity").read_text() == DEF_FILE.read_text()
    assert "export HPCTRAIN_IMAGE=1" in (meta / "env" / "90-environment.sh").read_text()
    assert json.loads((meta / "labels.json").read_text())["org.opencontainers.image.title"] == "hpctrain"
    assert (image / "opt/hpctrain/pyproject.toml").read_bytes() == (ROOT / "pyproject.toml").read_bytes()
    assert (image / "usr/bin/gcc").exists()  # %post's apt-get line ran
    assert list((image / "opt/conda/lib").glob("python3*/site-packages/optuna"))  # and its pip install


def test_inside_the_image_there_is_no_slurm_client_and_no_munge(image, tmp_path):
    # on the host they are there (the test cluster): the check below can fail
    assert shutil.which("scontrol") and Path("/etc/slurm/slurm.conf").exists() and Path("/run/munge").is_dir()
    proc = _inside(image, tmp_path, "sh", "-c", "command -v scontrol")
    assert proc.returncode != 0 and proc.stdout == "", proc
    probe = ("for t in scontrol squeue sbatch srun sinfo munge; do command -v $t && echo FOUND $t; done; "
             "for p in /etc/slurm /run/munge /usr/lib/x86_64-linux-gnu/slurm-wlm; do test -e $p && echo FOUND $p; done; "
             "echo checked")
    proc = _inside(image, tmp_path, "sh", "-c", probe)
    assert proc.returncode == 0 and proc.stdout.strip() == "checked", proc


def test_the_images_python_torch_and_hpctrain_run_inside(image, tmp_path):
    script = ("import sys, torch, hpctrain, submitit, hydra; print(sys.executable); print(torch.__version__); "
              "[print(m.__file__) for m in (torch, hpctrain, submitit, hydra)]")
    proc = _inside(image, tmp_path, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    executable, version, *files = proc.stdout.splitlines()
    assert executable == "/opt/conda/bin/python"
    import torch

    assert version == torch.__version__
    for f in files:  # every module from the image's site-packages: no host path leaked in
        assert re.match(r"^/opt/conda/lib/python3\.\d+/site-packages/", f), files


def test_the_utilisation_sampler_runs_in_the_image_on_cpu_figures_without_nvml(image, tmp_path):
    """The image has psutil and nvidia-ml-py but no driver library: NVML fails to start, the sampler goes on
    with CPU and memory figures."""
    script = ("import json, sys, time, pynvml\n"
              "try:\n    pynvml.nvmlInit()\n    print('nvml')\nexcept pynvml.NVMLError:\n    print('no nvml')\n"
              "from hpctrain.job.sampler import Sampler\n"
              "with Sampler(sys.argv[1], interval_s=0.05) as sampler:\n"
              "    deadline = time.time() + 20\n"
              "    while sampler.stats.n.get('cpu', 0) < 3 and time.time() < deadline:\n"
              "        sum(i * i for i in range(20000))\n"
              "print(json.dumps(sampler.summary()))\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _inside(image, tmp_path, "python", "-c", script, str(run_dir))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    nvml, summary = proc.stdout.splitlines()
    sampled = json.loads(summary)
    assert nvml == "no nvml" and sampled["samples"] >= 3 and sampled["rss_peak_gb"] > 0, proc.stdout
    assert not [k for k in sampled if k.startswith("gpu_")], sampled
    assert list((run_dir / "tb").glob("events.out.tfevents.*.sys"))


def test_binds_default_and_given(image, tmp_path):
    work, data = tmp_path / "work", tmp_path / "data x"
    work.mkdir()
    data.mkdir()
    (data / "f").write_text("hello\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    with tempfile.NamedTemporaryFile(dir=Path.home(), prefix=".hpctrain-bind-") as home_file:
        probe = ('pwd; cat "$1/f"; cat /mnt/in/f; test -e "$2" && echo HOME-BOUND; test -e "$3" || echo PROJECT-HIDDEN; '
                 'touch /ro/x 2>/dev/null || echo RO; touch /etc/x 2>/dev/null || echo RO-ROOT; echo ok > /tmp/written')
        proc = _inside(image, work, "sh", "-c", probe, "sh", str(data), home_file.name, str(ROOT / "pyproject.toml"),
                       opts=["--bind", f"{data}:/mnt/in", "--bind", str(data), "--bind", f"{ro}:/ro:ro"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(work), "hello", "hello", "HOME-BOUND", "PROJECT-HIDDEN", "RO", "RO-ROOT"]
    assert Path("/tmp/written").read_text() == "ok\n"  # /tmp is the host's
    assert not (image / "etc" / "x").exists()  # the image itself is never written


MINIMAL_DEV = {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
               "stdout", "tty", "urandom", "zero"}


def test_contain_gives_empty_home_and_tmp_a_minimal_dev_and_the_cwd_only_where_bound(image, tmp_path):
    """--contain as Apptainer's engine does it: $HOME, /tmp and /var/tmp are the container's own empty, writable
    dirs; the host's cwd is not bound, so the command starts there only where a --bind brings it, else in $HOME."""
    work, mark = tmp_path / "work", f"hpctrain-contain-{uuid.uuid4().hex}"
    work.mkdir()
    with tempfile.NamedTemporaryFile(dir=Path.home(), prefix=".hpctrain-contain-") as home_file:
        probe = ('pwd; ls -A "$HOME" /tmp /var/tmp | grep -v : | grep . || echo EMPTY; touch "$HOME/x" "/tmp/$2" /var/tmp/x '
                 '&& echo WRITABLE; test -e "$1" || echo HOME-FILE-HIDDEN; ls /dev')
        proc = _inside(image, work, "sh", "-c", probe, "sh", home_file.name, mark, opts=["--contain"])
    assert proc.returncode == 0, proc.stderr
    where, empty, writable, hidden, *dev = proc.stdout.splitlines()
    assert (where, empty, writable, hidden) == (str(Path.home()), "EMPTY", "WRITABLE", "HOME-FILE-HIDDEN"), proc.stdout
    assert set(dev) <= MINIMAL_DEV and {"null", "shm", "urandom"} <= set(dev), dev
    assert not (Path("/tmp") / mark).exists()  # written into the container's own /tmp, not the host's
    # the cwd bound (as hpctrain binds the project and the sweep dir): the command starts there
    proc = _inside(image, work, "sh", "-c", "pwd; touch here", opts=["--contain", "--bind", str(work)])
    assert proc.returncode == 0 and proc.stdout.splitlines() == [str(work)], proc
    assert (work / "here").exists()
    # --pwd to a directory the container lacks fails, as Apptainer's does
    proc = _inside(image, work, "pwd", opts=["--contain", "--pwd", str(tmp_path / "nowhere")])
    assert proc.returncode == 255 and "failed to set working directory" in proc.stderr, proc


def test_environment_as_apptainer_builds_it(image, tmp_path):
    env = {**os.environ, "APPTAINERENV_HPCTRAIN_PROBE": "from-prefix", "HOST_ONLY": "host",
           "PATH": "/nowhere/bin:" + os.environ["PATH"]}
    show = 'echo "$HPCTRAIN_PROBE|$HOST_ONLY|$HPCTRAIN_IMAGE|$PATH"'
    probe, host, marker, path = _inside(image, tmp_path, "sh", "-c", show, env=env).stdout.strip().split("|")
    assert (probe, host, marker) == ("from-prefix", "host", "1")
    assert path.startswith("/opt/conda/bin:") and "/nowhere" not in path  # the host's PATH is not passed
    probe, host, _, _ = _inside(image, tmp_path, "sh", "-c", show, opts=["--cleanenv"], env=env).stdout.strip().split("|")
    assert (probe, host) == ("from-prefix", "")


def test_the_contained_command_gets_the_signals_slurm_sends_and_the_stand_in_survives_them(image, tmp_path):
    """Slurm signals every process of a step: bwrap must outlive a USR2, the contained process handle it."""
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGUSR2, lambda *a: (print('usr2', flush=True), sys.exit(3)))\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([str(STANDIN), "exec", str(image), "python", "-c", script], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        p.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=30) == 3 and proc.stdout.read() == "usr2\n"
    # without a handler the default action holds inside (bwrap's own SIG_IGN is not inherited)
    proc = subprocess.Popen([str(STANDIN), "exec", str(image), "sh", "-c", "echo ready; exec sleep 60"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        p.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) in (-signal.SIGTERM, 128 + signal.SIGTERM)


def test_apptainer_test_runs_the_recipes_test_section(image, tmp_path):
    proc = apptainer(["test", str(image)], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.compile on cpu: ok" in proc.stdout and "hpctrain from /opt/conda/" in proc.stdout, proc.stdout


def test_the_stand_in_refuses_what_it_cannot_run(tmp_path):
    sif = tmp_path / "img.sif"
    sif.write_text("not a sandbox")
    for args in (["exec", str(sif), "true"], ["exec", str(tmp_path / "missing"), "true"], ["run", str(sif)],
                 ["exec", "--fakeroot", str(sif), "true"]):
        proc = apptainer(args, cwd=tmp_path)
        assert proc.returncode == 255 and proc.stderr.startswith("FATAL:"), (args, proc)


def test_image_forms_apptainer_runs_are_accepted(tmp_path):
    """A .sif file and a sandbox directory pass the login-node check; a directory that is no image, a FIFO or
    a missing path are refused in one line naming the key."""
    sif = tmp_path / "img.sif"
    sif.write_text("an image file")
    sandbox = tmp_path / "sandbox"
    (sandbox / ".singularity.d").mkdir(parents=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert check_container(str(sif), "apptainer", []) == []
    assert check_container(str(sandbox), "apptainer", []) == []
    key = "hydra.launcher.container.image="
    assert check_container(str(tmp_path), "apptainer", []) == [
        f"{key}{str(tmp_path)!r}: not a readable file or sandbox directory (a directory without .singularity.d in it)"]
    assert check_container(str(fifo), "apptainer", []) == [f"{key}{str(fifo)!r}: not a readable file or sandbox directory"]
    assert check_container(str(tmp_path / "no.sif"), "apptainer", []) == [f"{key}{str(tmp_path / 'no.sif')!r}: file not found"]
    # through the command line: the sandbox goes on the srun line as it is
    proc = run_hpctrain(["-m", "lr=1e-3", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.launcher.container.image={sandbox}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path)
    assert f" {sandbox} python -u -m submitit.core._submit" in proc.stdout
    proc = run_hpctrain(["-m", "lr=1e-3", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.launcher.container.image={tmp_path}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{key}{str(tmp_path)!r}: not a readable file or sandbox directory" in proc.stderr, proc.stderr


# ------------------------------------------------------------------------- the container path on Slurm
@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A bin dir holding the stand-in `apptainer` (bubblewrap over the test image) and an `sbatch` that logs
    each call, then runs the real one."""
    bin_dir = standin_bin(tmp_path)
    real_sbatch = subprocess.run(["which", "sbatch"], capture_output=True, text=True).stdout.strip()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$*" >> "$SBATCH_CALLS_LOG"\nexec {shlex.quote(real_sbatch)} "$@"\n')
    sbatch.chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, fake_bin: Path) -> Dict[str, str]:
    # Slurm passes the submitting PATH to the job: the stand-in is found on the compute node; the python that
    # runs inside is the image's (the stand-in resets PATH as Apptainer does)
    path = os.pathsep.join([str(fake_bin), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"PATH": path, "APPTAINER_STANDIN_LOG": str(tmp_path / "apptainer.jsonl"),
            "SBATCH_CALLS_LOG": str(tmp_path / "sbatch.log")}


PROBE_MODEL = """
import sys

import torch
import hpctrain


class Net(torch.nn.Linear):
    \"\"\"A linear model that writes down which interpreter, torch and hpctrain built it.\"\"\"

    def __init__(self, in_features, num_classes, out_dir):
        super().__init__(in_features, num_classes)
        with open(f"{out_dir}/interpreters.txt", "a") as f:
            f.write("\\t".join([sys.executable, torch.__file__, hpctrain.__file__]) + "\\n")
"""


def _calls(tmp_path: Path) -> List[dict]:
    log = tmp_path / "apptainer.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _split(calls: List[dict]):
    """(the srun tasks' calls, the other calls, e.g. the job script's teardown step)."""
    tasks = [c for c in calls if "submitit.core._submit" in c["argv"]]
    return tasks, [c for c in calls if c not in tasks]


def _binds(argv: List[str]) -> List[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]


def _script_part(dry_run_stdout: str) -> str:
    """The sbatch script a dry run prints: everything before its run list."""
    return dry_run_stdout.split("\nruns (", 1)[0].rstrip("\n")


def _jobs_submitted_from(cwd: Path) -> List[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line.split(" ", 1)[-1] == str(cwd)]


@pytest.mark.slurm
def test_sweep_runs_every_task_through_apptainer_exec_with_binds_intact(slurm_cluster, tmp_path, fake_bin, image):
    """A 2-point sweep in real isolation: each task in the image (its python, torch and hpctrain), seeing only
    the image and its binds; every path with odd characters arrives whole."""
    project = tmp_path / WEIRD  # the project dir (cwd), the sweep dir and the image all hold the odd name
    project.mkdir()
    (project / "probe.py").write_text(PROBE_MODEL)
    out = project / "out"
    out.mkdir()
    sandbox, image = image, project / "img sandbox"
    image.symlink_to(sandbox)
    extra = tmp_path / "data x;$(touch pwned)"
    extra.mkdir()
    sweep = project / "sweep"
    args = ["-m", "lr=1e-3,1e-4", "max_steps=20", "model._target_=probe.Net", f"+model.out_dir='{out}'",
            "hydra/launcher=slurm", "hydra.launcher.wait=true",
            f"hydra.launcher.container.image='{image}'", f"hydra.launcher.container.binds=['{extra}']",
            f"hydra.sweep.dir='{sweep}'"]
    env = _env(tmp_path, fake_bin)

    dry = run_hpctrain(args + ["hydra.launcher.dry_run=true"], cwd=project, env=env, timeout=60)
    assert not (tmp_path / "sbatch.log").exists() and not (sweep / ".submitit").exists()
    proc = run_hpctrain(args, cwd=project, env=env, timeout=120)

    assert (tmp_path / "sbatch.log").read_text().count("\n") == 1, "one sweep, one sbatch call"
    for run_dir in (sweep / "0_lr=0.001", sweep / "1_lr=0.0001"):
        record = json.loads((run_dir / "metrics.json").read_text())
        assert record["status"] == "completed" and record["step"] == 20, (run_dir, record, proc.stdout)
    calls = _calls(tmp_path)
    tasks, others = _split(calls)
    assert len(tasks) == 2, calls  # one task per array element, no GPUs
    assert sorted(c["env"]["SLURM_ARRAY_TASK_ID"] for c in tasks) == ["0", "1"]
    for call in calls:  # the tasks, and any other step of the job script run in the image (teardown)
        argv = call["argv"]
        assert argv[0] == "exec"
        assert "--nv" not in argv, "no GPUs asked for: no --nv"
        # every odd path arrived as ONE argument, unchanged
        assert _binds(argv) == [str(sweep), str(project), "/dev/shm", str(extra)]  # the node's, for every task
        assert argv[argv.index(str(image)) + 1] == "python"
        assert call["cwd"] == str(project)
        # any other path argument (the teardown's runs file) is whole too, not split at the space
        assert all(a.startswith((str(project), str(extra))) for a in argv if a.startswith(str(tmp_path))), argv
    for call in tasks:
        argv = call["argv"]
        assert argv[argv.index(str(image)) + 1:] == ["python", "-u", "-m", "submitit.core._submit",
                                                     str(sweep / ".submitit")]
    assert not list(tmp_path.rglob("pwned")), "a path was run as shell code"
    # both runs were built by the image's interpreter and torch; hpctrain from the image or the code snapshot
    built = [line.split("\t") for line in (out / "interpreters.txt").read_text().splitlines()]
    assert len(built) == 2, built
    for executable, torch_file, hpctrain_file in built:
        assert executable == "/opt/conda/bin/python" and torch_file.startswith("/opt/conda/lib/"), built
        assert hpctrain_file.startswith(("/opt/conda/lib/", str(sweep))), built

    # the dry run printed exactly the script that was submitted
    (submitted,) = (sweep / ".submitit").glob("*_submission.sh")
    assert _script_part(dry.stdout) == submitted.read_text().rstrip("\n")


@pytest.mark.slurm
def test_gpu_sweep_passes_nv(slurm_cluster, tmp_path, fake_bin, image):
    sweep = tmp_path / "sweep"
    # device=cpu: the test cluster's GPUs are fake, and device=auto refuses a GPU job without CUDA
    run_hpctrain(["-m", "lr=1e-3", "max_steps=20", "device=cpu", "hydra/launcher=slurm", "hydra.launcher.wait=true",
                  "hydra.launcher.gpus_per_node=1", f"hydra.launcher.container.image={image}",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=_env(tmp_path, fake_bin), timeout=120)
    tasks, others = _split(_calls(tmp_path))
    assert len(tasks) == 1, tasks
    for call in tasks + others:
        argv = call["argv"]
        assert argv[:2] == ["exec", "--nv"]
        assert _binds(argv) == [str(sweep), str(tmp_path), "/dev/shm"] and str(image) in argv
    assert tasks[0]["env"].get("CUDA_VISIBLE_DEVICES") == "0"  # Slurm gave the task one (fake) GPU
    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"


@pytest.mark.slurm
def test_missing_image_fails_on_the_login_node(slurm_cluster, tmp_path, fake_bin):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "max_steps=20", "hydra/launcher=slurm",
                         f"hydra.launcher.container.image={tmp_path / 'missing.sif'}", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path, env=_env(tmp_path, fake_bin), timeout=60, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "hydra.launcher.container.image" in out and "missing.sif" in out, out
    assert not (tmp_path / "sbatch.log").exists(), "sbatch was called"
    assert not (sweep / ".submitit").exists()
    assert _jobs_submitted_from(tmp_path) == []
    assert _calls(tmp_path) == []


def test_submitit_folder_outside_the_sweep_dir_is_bound(tmp_path):
    """The job's pickles and logs must be visible inside the container wherever they are kept."""
    image = tmp_path / "img.sif"
    image.write_text("stand-in")
    folder = tmp_path / "scratch" / "jobs"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.launcher.container.image={image}", f"hydra.launcher.submitit_folder={folder}",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    srun = next(line for line in proc.stdout.splitlines() if line.startswith("srun "))
    assert f"--bind {tmp_path / 'sweep'} --bind {tmp_path} --bind {folder} --bind /dev/shm {image} python" in srun
    assert not folder.exists()  # a dry run creates nothing
