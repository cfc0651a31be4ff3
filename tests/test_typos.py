"""A mistyped or unknown key gets hpctrain's one line (with the closest real key), once per key, never
Hydra's advice to add it with `+`; nothing is submitted and no sweep dir is left. `--help` lists every key."""

import dataclasses
import subprocess
import sys

import pytest

from cli_helpers import HELPERS, hpctrain_env

pytestmark = pytest.mark.login


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=120)


def _refused(tmp_path, *overrides: str) -> str:
    """The one line a dry-run sweep of ``overrides`` is refused with (checked: exit 1, nothing left)."""
    sweep = tmp_path / "s"
    proc = _run("-m", *overrides, "hydra/launcher=local", "hydra.launcher.dry_run=true", f"hydra.sweep.dir={sweep}",
                cwd=tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "To append" not in proc.stderr and "use +" not in proc.stderr
    assert "schema" not in proc.stderr
    assert not sweep.exists() and not (tmp_path / "multirun").exists()
    return lines[0]


@pytest.mark.parametrize("overrides, expected", [
    (["lrr=1e-3,1e-4"], "hpctrain: lrr: no such key in the config; did you mean lr?"),
    (["lrr=1e-3,1e-4", "seed=range(0,500)"], "hpctrain: lrr: no such key in the config; did you mean lr?"),
    (["model.hiden=128"], "hpctrain: model.hiden: no such key in the config; did you mean model.hidden?"),
    (["hydra.launcher.max_paralel=2"],
     "hpctrain: hydra.launcher.max_paralel: no such key in the config; did you mean hydra.launcher.max_parallel?"),
    (["hydra.sweeper.n_trial=2", "hydra/sweeper=search"],
     "hpctrain: hydra.sweeper.n_trial: no such key in the config; did you mean hydra.sweeper.n_trials?"),
    (["max_steps=1.5"], "hpctrain: max_steps=1.5: expected an integer"),
    (["max_steps=100,1.5", "seed=0,1"], "hpctrain: max_steps=1.5: expected an integer"),
    (["model=mlpp"], "hpctrain: model=mlpp: no such option of the config group 'model'; did you mean mlp? "
                     "(options: cnn, gpt, mlp)"),
    (["weight_decay=0.1"], "hpctrain: weight_decay: no such key in the config; did you mean optim.weight_decay?"),
    (["model=mlp,cnn", "model.width=3"], "hpctrain: model.width: fits only the points with model=cnn; a key that "
                                         "is not swept must fit every point"),
    (["model=mlp,cnn", "model.hidden=3"], "hpctrain: model.hidden: does not fit the points with model=cnn; a key "
                                          "that is not swept must fit every point"),
    (["+lrr=1e-3,1e-4"], "hpctrain: +lrr: hpctrain's app does not read this key, so sweeping it gives 2 "
                         "identical runs; did you mean lr?"),
])
def test_a_typo_is_one_line_of_ours_once_per_key(tmp_path, overrides, expected):
    assert _refused(tmp_path, *overrides) == expected  # (1000 points over a typo: still one line)


def test_a_typo_in_a_sweep_file_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    (tmp_path / "conf" / "sweep" / "mine.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      lrr: 1e-3,1e-4\n      seed: 0,1\n")
    line = _refused(tmp_path, "+sweep=mine", f"--config-dir={tmp_path / 'conf'}")
    assert line == "hpctrain: lrr: no such key in the config; did you mean lr?"


def test_an_added_key_is_not_matched_to_an_unrelated_one(tmp_path):
    proc = _run("-m", "+typo=1", "hydra/launcher=local", "hydra.launcher.dry_run=true",
                f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "typo" in line]
    assert warnings == ["hpctrain: warning: typo: hpctrain's app does not read this key, so it changes nothing"]


def test_the_closest_key_is_within_a_typos_reach():
    from hpctrain.submit.keys import closest

    top = [f.name for f in dataclasses.fields(__import__("hpctrain.schema").schema.TrainConfig)]
    assert closest("typo", top) is None and closest("preciison", top) == "precision"
    assert closest("lrr", top) == "lr" and closest("learning_rate", top) == "lr"
    assert closest("hidden", ["model", "model.hidden", "hydra.job.name"]) == "model.hidden"
    assert closest("name", ["model", "hydra.job.name"]) is None  # Hydra's keys only for hydra.* names


@pytest.mark.parametrize("flag, shown", [(["--cfg", "hydra"], "launcher:"), (["--cfg", "job"], "lr: 0.001"),
                                          (["--info"], "Hydra"), (["--info", "defaults"], "Defaults List")])
def test_hydras_own_flags_work_with_a_sweep_command(tmp_path, flag, shown):
    proc = _run("-m", "lr=1e-3", *flag, cwd=tmp_path)
    assert proc.returncode == 0 and shown in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "multirun").exists()


def test_cfg_of_a_sweep_is_one_line(tmp_path):
    proc = _run("-m", "lr=1e-3,1e-2", "--cfg", "job", "hydra/launcher=local", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        "hpctrain: lr: --cfg and --info show one config, and lr=1e-3,1e-2 is a sweep; give it one value to see "
        "that run's config"], proc.stderr


def test_a_typo_through_the_api_is_a_one_line_exception_leaving_nothing(tmp_path):
    code = ("import hpctrain, hpctrain.api, sys\n"
            "try:\n    hpctrain.launch(['lrr=1e-3,1e-4'], launcher='local', sweep_dir='s')\n"
            "except hpctrain.api.SweepError as exc:\n    print(exc)\n    sys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "hpctrain: lrr: no such key in the config; did you mean lr?"
    assert not (tmp_path / "s").exists()


def test_a_foreign_apps_swept_typo_is_one_line_and_its_good_sweep_still_runs(tmp_path):
    app = [sys.executable, str(HELPERS / "foreign_app.py"), "-m", "hydra/launcher=local", "hydra/sweeper=hpctrain"]
    bad = subprocess.run(app + ["x=0,1,2", f"hydra.sweep.dir={tmp_path / 'bad'}"], cwd=tmp_path, env=hpctrain_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    lines = [line for line in bad.stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    assert lines == ["nothing submitted: x: no such key in the config (`--cfg job` shows the config)"], bad.stderr
    assert not (tmp_path / "bad").exists()
    good = subprocess.run(app + ["+x=0,1", f"hydra.sweep.dir={tmp_path / 'good'}"], cwd=tmp_path, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "2 completed, 0 failed" in good.stdout + good.stderr, good.stdout + good.stderr


def test_help_lists_every_key_of_the_schema(tmp_path):
    from hpctrain.schema import TrainConfig

    proc = _run("--help", cwd=tmp_path)
    keys = proc.stdout.partition("Keys (")[2].partition("Config groups")[0]
    listed = {line.split()[0] for line in keys.splitlines()[1:] if line.startswith("  ") and line.strip()}
    missing = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in listed]
    assert not missing, f"--help leaves out {missing}"
    for name in ("warmup_steps", "min_lr_ratio", "grad_clip", "device", "schedule", "eval_batches"):
        assert f"  {name} " in keys
