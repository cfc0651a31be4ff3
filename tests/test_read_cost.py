"""The read side's work per run, counted in function calls (independent of the machine's load): status and
``hpctrain.load`` read 10,000 runs on the login node (issue 31: each under 1 s)."""

import sys
from pathlib import Path

from hpctrain.core import events

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_record_bulk import _calls  # noqa: E402


def _record(run: Path, end: str) -> Path:
    events.submitted(run)
    events.started(run, job_id="1_0")
    events.completed(run) if end == "completed" else events.failed(run, "RuntimeError: boom", rank=0)
    return run


def test_reading_a_record_parses_its_names_and_folds_in_few_calls(tmp_path):
    done, failed = _record(tmp_path / "done", "completed"), _record(tmp_path / "failed", "failed")
    assert events.read(done).state.value == "completed" and events.read(failed).error == "RuntimeError: boom"
    # measured: 104 and 278 calls (the failed one opens its error's file); before, 154 and 331
    assert _calls(lambda: events.read(done)) <= 115
    assert _calls(lambda: events.read(failed)) <= 295


def test_a_run_row_given_its_state_does_not_parse_it_again():
    from hpctrain.core.state import State
    from hpctrain.review.runs import Run

    def make():
        return Run(idx=0, name="a", values={}, overrides=[], run_dir=None, job_id=None, state=State.COMPLETED)

    assert make().state is State.COMPLETED and Run(**{**make().to_dict(), "state": "failed"}).state is State.FAILED
    assert _calls(make) <= 4  # the dataclass's init and its check; an Enum call more (~25 us a row) before
