"""A dry run and a refused sweep leave no sweep dir under multirun/ (issue 29 item 4): ``status``, ``report``
and ``tensorboard`` without a dir keep pointing at the last real sweep."""

import subprocess
import sys
import time

from cli_helpers import hpctrain_env, run_hpctrain


def sweep_dirs(cwd) -> list:
    return sorted(str(p.relative_to(cwd)) for p in (cwd / "multirun").glob("*/*"))


def test_a_dry_run_and_a_refused_sweep_leave_the_default_on_the_last_real_sweep(tmp_path):
    base = ["-m", "lr=0.01,0.001", "max_steps=5", "eval_every=0", "hydra/launcher=local"]
    run_hpctrain(base, cwd=tmp_path)
    real = sweep_dirs(tmp_path)
    assert len(real) == 1, real
    time.sleep(1.1)  # Hydra's default sweep dir is named to the second: the next command would get a new one

    dry = run_hpctrain([*base, "hydra.launcher.dry_run=true"], cwd=tmp_path)
    assert "dry run: nothing submitted" in dry.stdout, dry.stdout + dry.stderr
    time.sleep(1.1)
    refused = run_hpctrain(["-m", "lr=0.01,0.02", "max_steps=5", "hydra/launcher=local", "hydra.launcher.max_retries=-1"],
                           cwd=tmp_path, check=False)
    assert refused.returncode != 0 and "nothing submitted" in refused.stdout + refused.stderr, refused.stderr
    assert sweep_dirs(tmp_path) == real, "a dry run or a refused sweep left a sweep dir behind"
    assert [p.name for p in (tmp_path / "multirun").iterdir()] == [real[0].split("/")[1]]  # no empty date dir

    status = subprocess.run([sys.executable, "-m", "hpctrain", "status"], cwd=tmp_path, env=hpctrain_env(),
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.splitlines()[0].startswith(f"sweep {tmp_path / real[0]}"), status.stdout
    assert status.stdout.splitlines()[-1] == "2 runs: 2 completed", status.stdout
