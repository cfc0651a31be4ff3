"""Bad input on the login node: one line naming the key or file, exit non-zero, nothing written, quickly.

Sizes are counted before any point is listed (``seed=range(0,1000000)``), config files are read as YAML
nodes before Hydra builds them (an alias bomb, ``!!python/object``, bytes that are not UTF-8), run dirs
must be unique and inside the sweep dir, and what Hydra would answer with a traceback (``model=3``, a
value nested 300 deep, ``${nope}`` in a sweep file) is one line. A hypothesis fuzz over override strings
and sweep-file YAML holds all of it at once.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import run_hpctrain

pytestmark = pytest.mark.login

DRY = ["-m", "hydra/launcher=local", "hydra.launcher.dry_run=true"]
# nine anchors of nine: 9**9 strings once built, from a file of a few hundred bytes
BOMB = "# @package _global_\nx:\n" + "".join(
    f"  {k}: &{k} [{', '.join([prev] * 9)}]\n"
    for k, prev in zip("abcdefghi", ['"lol"'] + [f"*{c}" for c in "abcdefgh"]))


def _only(tmp_path: Path, *names: str) -> None:
    """Nothing written in ``tmp_path`` but what the test put there."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def _one_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr and len(lines) <= 2, proc.stderr  # a header line, then the problem
    for text in expected:
        assert text in proc.stderr, proc.stderr
    return proc.stderr


def _sweep_file(tmp_path: Path, text) -> None:
    folder = tmp_path / "cfg" / "sweep"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "f.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())


def test_a_million_points_are_refused_in_under_two_seconds_with_the_numbers(tmp_path):
    start = time.monotonic()
    proc = run_hpctrain(DRY + ["seed=range(0,1000000)", "lr=1e-3,1e-4", f"hydra.sweep.dir={tmp_path / 's'}"],
                        cwd=tmp_path, check=False, timeout=120)
    elapsed = time.monotonic() - start
    _one_line(proc, "2000000 points (seed: 1000000 x lr: 2)", "at most 100000")
    _only(tmp_path)
    assert elapsed < 2 + _startup_s(tmp_path), elapsed  # the refusal itself: under 2 s past a bare start


def _startup_s(tmp_path: Path) -> float:
    """What a refused run of the app costs without a sweep to count (this machine's load included)."""
    start = time.monotonic()
    run_hpctrain(["model=3"], cwd=tmp_path, check=False, timeout=120)
    return time.monotonic() - start


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_more_points_than_the_cluster_queues_are_pulled_by_as_many_workers_as_one_array_holds(tmp_path):
    proc = run_hpctrain(["-m", "seed=range(0,20001)", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("hpctrain: 20001 runs would be 20001 jobs in the queue and the cluster holds at most 10000 "
            "(MaxJobCount): 1001 workers pull the runs instead (hydra.launcher.workers=1001)") in proc.stdout
    assert "runs (20001 to submit pulled by 1001 worker(s), 0 already completed):" in proc.stdout
    assert "dry run: nothing submitted" in proc.stdout


def test_a_yaml_alias_bomb_in_a_sweep_file_is_refused_unbuilt(tmp_path):
    _sweep_file(tmp_path, BOMB)
    assert len(BOMB) < 500  # a few hundred bytes
    proc = run_hpctrain(["-m", "--config-dir", "cfg", "+sweep=f"] + DRY[1:] + [f"hydra.sweep.dir={tmp_path / 's'}"],
                        cwd=tmp_path, check=False, timeout=60)
    _one_line(proc, "cfg/sweep/f.yaml: its aliases expand to more than 100000 nodes")
    _only(tmp_path, "cfg")


@pytest.mark.parametrize("text, expected", [
    ("# @package _global_\nx: !!python/object/apply:os.system ['touch PWNED']\n", "cfg/sweep/f.yaml: line 2: tag"),
    (b"# @package _global_\nx: '\xff\xfe'\n", "cfg/sweep/f.yaml: not UTF-8 text"),
    ("# @package _global_\nx: [1, 2\n", "cfg/sweep/f.yaml: not valid YAML"),
    ("# @package _global_\nhydra:\n  sweeper:\n    params:\n      lr: ${nope}\n", "hydra.sweeper: Interpolation key 'nope'"),
])
def test_a_bad_sweep_file_is_one_line_naming_it(tmp_path, text, expected):
    _sweep_file(tmp_path, text)
    proc = run_hpctrain(["-m", "--config-dir", "cfg", "+sweep=f"] + DRY[1:] + [f"hydra.sweep.dir={tmp_path / 's'}"],
                        cwd=tmp_path, check=False, timeout=60)
    _one_line(proc, expected)
    _only(tmp_path, "cfg")


@pytest.mark.parametrize("override, expected", [
    ("model=3", "model=3: expected an option of the config group 'model' (cnn, "),
    ("optim=true", "optim=true: expected an option of the config group 'optim'"),
    ("+x=" + "[" * 300 + "]" * 300, "+x: its value is nested 300 levels deep; expected at most 32"),
    ("hydra.sweep.subdir=../../x_${hydra.job.num}", "hydra.sweep.subdir='../../x_${hydra.job.num}': run 0's dir"),
    ("hydra.sweep.subdir=/tmp/elsewhere_${hydra.job.num}", "is not inside the sweep dir"),
    ("hydra.sweep.subdir=same", "run 0 (lr=0.001) and run 1 (lr=0.1) have the same run dir"),
])
def test_bad_overrides_are_one_line_naming_the_key_and_write_nothing(tmp_path, override, expected):
    proc = run_hpctrain(DRY + ["lr=1e-3,1e-1", override, f"hydra.sweep.dir={tmp_path / 'a' / 's'}"],
                        cwd=tmp_path, check=False, timeout=60)
    _one_line(proc, expected)
    _only(tmp_path)  # nor multirun.yaml, nor the sweep dir or its parent: what Hydra wrote is taken back


def test_a_refusal_on_a_rerun_puts_the_earlier_multirun_yaml_back(tmp_path):
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("earlier: 1\n")
    proc = run_hpctrain(DRY + ["lr=-1,1e-1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False, timeout=60)
    _one_line(proc, "lr=-1.0: expected a number > 0")
    assert (sweep / "multirun.yaml").read_text() == "earlier: 1\n"


def test_an_env_secret_is_refused_before_hydra_writes_it_down(tmp_path):
    secret = "hf_sekrit_4f1c"
    proc = run_hpctrain(DRY + ["lr=1e-3,1e-1", f"+hydra.launcher.env.HF_TOKEN={secret}",
                               f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path, check=False, timeout=60)
    _one_line(proc, "hydra.launcher.env.HF_TOKEN: looks like a secret")
    assert secret not in proc.stdout + proc.stderr
    _only(tmp_path)


@pytest.mark.parametrize("args, expected", [
    (["--port", "99999"], "argument --port: '99999': expected a port number from 1 to 65535"),
    (["--port", "http"], "argument --port: 'http': expected a port number from 1 to 65535"),
    (["--host", "nosuch.invalid"], "argument --host: 'nosuch.invalid': does not resolve"),
])
def test_tensorboard_arguments_are_checked_before_anything_starts(tmp_path, args, expected):
    proc = run_hpctrain(["tensorboard", *args, str(tmp_path)], cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert expected in proc.stderr.strip().splitlines()[-1]  # argparse's usage, then the one line


def test_hydra_files_that_are_not_utf8_do_not_crash_the_readers(tmp_path):
    sweep = tmp_path / "s"
    run_dir = sweep / "0_lr=0.1"
    (run_dir / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_bytes(b"hydra: {sweeper: {params: {lr: '\xff'}}}\n")
    (run_dir / ".hydra" / "overrides.yaml").write_bytes(b"- lr=\xff\n")
    for command in ("status", "report"):
        proc = run_hpctrain([command, str(sweep)], cwd=tmp_path, check=False, timeout=60)
        _one_line(proc, f"{sweep}: neither a launcher manifest (sweep.json) nor a readable multirun.yaml")
    from hpctrain.review.cost import allocation

    assert allocation(sweep).gpus == 0  # the launcher's settings unreadable: none assumed


# ---------------------------------------------------------------- fuzz: the login-node path, in one interpreter
KEYS = ["lr", "seed", "model", "optim", "+x", "max_steps", "hydra.launcher.job_name", "hydra.sweep.subdir",
        "+hydra.launcher.env.A", "+hydra.launcher.additional_parameters.comment", "hydra.launcher.setup"]
VALUE_CHARS = "ab01.e-+=,[]{}()'\"$:\\/ \n\t\x00~@*&!"
VALUES = st.one_of(
    st.text(VALUE_CHARS, max_size=24),
    st.sampled_from(["range(0,1000000)", "1e-3,1e-4", "${nope}", "3", "true", "[" * 40 + "]" * 40, "'a\nb'",
                     "choice(1,2)", "glob(*)", "interval(0,1)", "same", "../x", "/abs", "null", "'\x7f'"]))
OVERRIDES = st.lists(st.tuples(st.sampled_from(KEYS), VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=3)
YAML_PIECES = ["lr: 1e-3,1e-4", "seed: range(0,1000000)", "lr: ${nope}", "x: !!python/object:os.system", "a: &a [1, 2]",
               "b: [*a, *a, *a]", "c: *nosuch", "lr: [1, [2, [3]]]", "model: 3", "'\x01': 1", "lr: '\n'", "{", "- 1"]
SWEEP_FILES = st.lists(st.sampled_from(YAML_PIECES) | st.text(VALUE_CHARS, max_size=20), max_size=4).map(
    lambda lines: "# @package _global_\nhydra:\n  sweeper:\n    params:\n" + "".join(f"      {ln}\n" for ln in lines))

DRIVER = """
import contextlib, io, json, os, sys
from hydra.core.global_hydra import GlobalHydra
from hpctrain.__main__ import main

for line in sys.stdin:
    argv, folder = json.loads(line)
    os.chdir(folder)
    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # what main let through: a traceback the user would see
            import traceback
            err.write("Traceback (uncaught)\\n" + traceback.format_exc())
            rc = 1
    print(json.dumps({"rc": rc, "out": out.getvalue(), "err": err.getvalue()}), flush=True)
"""


@pytest.fixture(scope="module")
def driver():
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    yield proc
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()  # a case that hung: the failure is reported, the process must not outlive the test
        proc.wait()


def _case(driver, tmp_path_factory, overrides, sweep_file=None) -> None:
    import json
    import select

    folder = tmp_path_factory.mktemp("fuzz")
    args = list(DRY)
    if sweep_file is not None:
        _sweep_file(folder, sweep_file)
        args = ["-m", "--config-dir", "cfg", "+sweep=f"] + DRY[1:]
    args += overrides + [f"hydra.sweep.dir={folder / 'out' / 's'}"]
    driver.stdin.write(json.dumps([args, str(folder)]) + "\n")
    driver.stdin.flush()
    ready, _, _ = select.select([driver.stdout], [], [], 20)
    assert ready, f"no answer in 20 s (a hang) for {args}"
    result = json.loads(driver.stdout.readline())
    assert "Traceback" not in result["err"] and "Error executing job" not in result["err"], (args, result["err"])
    if result["rc"] != 0:
        assert result["err"].strip(), (args, result)  # a refusal says why
        assert not (folder / "out").exists(), (args, result["err"])  # and wrote nothing


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@FUZZ
@given(overrides=OVERRIDES)
def test_fuzz_overrides_never_trace_back_hang_or_write_before_refusing(driver, tmp_path_factory, overrides):
    _case(driver, tmp_path_factory, overrides)


@FUZZ
@given(sweep_file=SWEEP_FILES, overrides=OVERRIDES)
def test_fuzz_sweep_files_never_trace_back_hang_or_write_before_refusing(driver, tmp_path_factory, sweep_file,
                                                                       overrides):
    _case(driver, tmp_path_factory, overrides, sweep_file)
