"""A run says how far it is in its own log: a line on log steps, at most one every few seconds."""

from cli_helpers import run_hpctrain

from hpctrain.train.loggers import ProgressLine


def test_lines_are_rate_limited_and_carry_step_loss_lr_rate_and_eta():
    now = [0.0]
    line = ProgressLine(max_steps=100, every_s=5.0, clock=lambda: now[0])
    first = line.line(10, {"train/loss": 0.5, "train/lr": 1e-3})
    assert first == "step 10/100 (10%)  loss 0.5  lr 0.001"  # no rate yet: nothing to measure it from
    now[0] = 1.0
    assert line.line(20, {"train/loss": 0.4}) is None  # 1 s after the last line: too soon
    now[0] = 6.0
    assert line.line(60, {"train/loss": 0.3, "train/lr": 1e-3}) == \
        "step 60/100 (60%)  loss 0.3  lr 0.001  8.33 steps/s  ETA 5s"
    now[0] = 7.0
    assert line.line(100, {"train/loss": 0.2}).startswith("step 100/100 (100%)  loss 0.2  40 steps/s")  # the last: always


def test_a_run_writes_progress_lines_to_its_log(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_hpctrain(["max_steps=40", "log_every=10", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    log = (run_dir / "hpctrain.log").read_text()
    assert "step 10/40 (25%)  loss " in log, log
    assert "step 40/40 (100%)" in log, log  # the last step's line, however soon after the one before
    assert "step 10/40" in proc.stdout + proc.stderr  # a run in the foreground shows it on the console
