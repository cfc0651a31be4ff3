"""GPUs and CPUs as the launchers hand them out: physical GPU indices on the local launcher, one GPU per
rank checked on the login node, --nv whenever the job gets GPUs, and each srun task its CPUs."""

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli_helpers import hpctrain_env, run_hpctrain

from hpctrain.submit.backends.local import gpu_slots, visible_gpus

# A plain Hydra app (the launchers serve any): it writes what its task was given into its run dir.
APP = textwrap.dedent('''
    import os
    from pathlib import Path

    import hydra
    from hydra.core.hydra_config import HydraConfig


    @hydra.main(version_base="1.3", config_path=None)
    def main(cfg):
        out = Path(HydraConfig.get().runtime.output_dir)
        (out / "cuda_visible_devices").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
        (out / "cpus").write_text(str(len(os.sched_getaffinity(0))))
        return 0.0


    if __name__ == "__main__":
        main()
''')


def _run_app(tmp_path: Path, args, env=None, check=True, timeout=180) -> subprocess.CompletedProcess:
    app = tmp_path / "app.py"
    app.write_text(APP)
    proc = subprocess.run([sys.executable, str(app), *args], cwd=tmp_path, env=hpctrain_env(env),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _given(sweep: Path, name: str):
    return [(d / name).read_text() for d in sorted(p for p in sweep.iterdir() if (p / name).exists())]


# ------------------------------------------------------------------------------------- local launcher
def test_visible_gpus_are_the_parents_physical_indices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu_slots([2, 3], 1, 2) == [[2], [3]]
    assert gpu_slots([4, 5, 6, 7], 2, 2) == [[4, 5], [6, 7]]
    assert gpu_slots([2, 3], 1, 5) == [[2], [3]]  # never an index past the end
    assert gpu_slots([2, 3, 5], 2, 2) == [[2, 3]]


def test_local_runs_are_pinned_to_the_parents_gpus(tmp_path):
    sweep = tmp_path / "s"
    _run_app(tmp_path, ["-m", "+x=1,2,3,4", "hydra/launcher=local", "hydra.launcher.gpus_per_node=1",
                        f"hydra.sweep.dir={sweep}"], env={"CUDA_VISIBLE_DEVICES": "2,3"})
    given = _given(sweep, "cuda_visible_devices")
    assert len(given) == 4 and set(given) == {"2", "3"}, given  # physical 2 and 3, never 0 or 1


def test_local_max_parallel_beyond_the_visible_gpus_is_refused(tmp_path):
    proc = _run_app(tmp_path, ["-m", "+x=1,2,3", "hydra/launcher=local", "hydra.launcher.gpus_per_node=1",
                               "hydra.launcher.max_parallel=3", f"hydra.sweep.dir={tmp_path / 's'}"],
                    env={"CUDA_VISIBLE_DEVICES": "2,3"}, check=False)
    assert proc.returncode != 0
    assert "hydra.launcher.max_parallel=3: 3 runs x gpus_per_node=1 need 3 GPUs; this machine has 2 visible (2,3)" \
        in proc.stderr
    assert not (tmp_path / "s" / ".submitit").exists()


def test_gpu_uuids_in_cuda_visible_devices_are_refused(tmp_path):
    proc = _run_app(tmp_path, ["-m", "+x=1", "hydra/launcher=local", f"hydra.sweep.dir={tmp_path / 's'}"],
                    env={"CUDA_VISIBLE_DEVICES": "GPU-8f3b1c2d"}, check=False)
    assert proc.returncode != 0 and "CUDA_VISIBLE_DEVICES=GPU-8f3b1c2d: the local launcher pins" in proc.stderr


@pytest.mark.parametrize("launcher,env", [("local", {"CUDA_VISIBLE_DEVICES": "0,1"}), ("slurm", {})])
def test_more_tasks_than_gpus_per_node_is_refused_on_the_login_node(tmp_path, launcher, env):
    proc = run_hpctrain(["-m", "max_steps=5", f"hydra/launcher={launcher}", "hydra.launcher.gpus_per_node=2",
                         "hydra.launcher.tasks_per_node=3", "batch_size=60", "hydra.launcher.dry_run=true",
                         f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path, env=env, check=False, timeout=60)
    assert proc.returncode != 0
    assert "hydra.launcher.tasks_per_node=3: more than gpus_per_node=2; ranks would share a GPU" in proc.stderr


# ------------------------------------------------------------------------------------ Slurm job script
def _srun(tmp_path: Path, extra) -> list:
    image = tmp_path / "img.sif"
    image.touch()
    proc = run_hpctrain(["-m", "max_steps=5", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.launcher.container.image={image}", f"hydra.sweep.dir={tmp_path / 's'}", *extra],
                        cwd=tmp_path, timeout=60)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("srun ")]
    return shlex.split(line)


@pytest.mark.parametrize("extra", [
    ["hydra.launcher.gpus_per_node=1"],
    ["+hydra.launcher.additional_parameters.gres=gpu:1"],
    ["+hydra.launcher.additional_parameters.gres=gpu:tesla:1"],
    ["+hydra.launcher.additional_parameters.gpus_per_task=1"],
    ["+hydra.launcher.additional_parameters.gpus=1"],
])
def test_the_container_gets_nv_however_gpus_are_asked_for(tmp_path, extra):
    argv = _srun(tmp_path, extra)
    assert argv[argv.index("apptainer"):][:3] == ["apptainer", "exec", "--nv"], argv


def test_no_gpus_no_nv(tmp_path):
    argv = _srun(tmp_path, ["+hydra.launcher.additional_parameters.gres=shard:1"])
    assert "--nv" not in argv


def test_srun_gives_each_task_its_cpus(tmp_path):
    assert "--cpus-per-task=2" in _srun(tmp_path, ["hydra.launcher.cpus_per_task=2"])
    assert not any(a.startswith("--cpus-per-task") for a in _srun(tmp_path, []))


@pytest.mark.slurm
def test_each_task_of_a_step_has_cpus_per_task_cores(slurm_cluster, tmp_path):
    """Needs TaskPlugin=task/affinity (the test cluster's). With core binding, as production clusters
    configure it (TaskPluginParam=cores; here --cpu-bind=cores), a task that srun was not told its CPU
    count is bound to one core (measured: mask 0x1 without --cpus-per-task, 0x3 with it)."""
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    assert "task/affinity" in out, "the test cluster does not bind tasks to CPUs: this test would prove nothing"
    sweep = tmp_path / "s"
    _run_app(tmp_path, ["-m", "+x=1", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=2",
                        "hydra.launcher.srun_args=['--cpu-bind=cores']", "hydra.launcher.wait=true",
                        f"hydra.sweep.dir={sweep}"], timeout=300)
    assert _given(sweep, "cpus") == ["2"]
