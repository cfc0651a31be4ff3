"""TensorBoard's HParams tab lists a run from its start: the session-start record is written at step 0,
before the first scalar; the end record (and the experiment with its metrics) at the end (issue 29 item 5)."""

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from cli_helpers import run_hpctrain


def test_session_start_comes_before_the_first_scalar_and_the_end_at_the_end(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "lr=1e-3,1e-2", "max_steps=6", "log_every=2", "eval_every=3", "hydra/launcher=local",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    for run_dir in sorted(p for p in sweep.iterdir() if (p / "tb").is_dir()):
        tags = []
        for event_file in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
            for event in EventFileLoader(str(event_file)).Load():
                tags += [(v.tag, event.step) for v in event.summary.value]
        names = [t for t, _ in tags]
        start = names.index("_hparams_/session_start_info")
        assert tags[start][1] == 0 and start < names.index("train/loss"), tags
        assert names.index("_hparams_/experiment") > max(i for i, n in enumerate(names) if n == "train/loss")
        assert names[-1] != "_hparams_/session_start_info" and "_hparams_/session_end_info" in names
