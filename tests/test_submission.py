"""The submission object (hpctrain/submit/submission.py): what each task's job is called with, and the run
list the job script reads after each attempt (hpctrain/job/attempt_ended.py), old and new forms."""

import json
from pathlib import Path

import pytest

from hpctrain.core.run import RunSpec
from hpctrain.job.attempt_ended import task_run_dirs
from hpctrain.submit.submission import Calling, Files, Submission, tasks_of

pytestmark = pytest.mark.login


def _submission(tmp_path: Path, calling: Calling, per_task: int = 1) -> Submission:
    sweep = tmp_path / "sweep"
    specs = [RunSpec(i, (f"lr={i}",), sweep / f"{i}_lr={i}", 10) for i in range(3)]
    return Submission(kind="local", sweep_dir=sweep, files=Files.next_in(sweep), python="python", calling=calling,
                      tasks=tasks_of(specs, per_task))


def test_each_task_is_called_with_its_run_specs(tmp_path):
    one = _submission(tmp_path, Calling.RUN)
    (args,) = one.args()
    assert [RunSpec.from_json(a, one.sweep_dir) for a in args] == one.runs
    assert args[1] == {"idx": 1, "overrides": ["lr=1"], "run_dir": "1_lr=1", "max_steps": 10}
    packed = _submission(tmp_path, Calling.PACK, per_task=2)
    (args,) = packed.args()
    assert [[s["idx"] for s in task] for task in args] == [[0, 1], [2]]
    workers = _submission(tmp_path, Calling.POSITIONAL)
    assert workers.args(1, 2) == [[1], [["lr=1"]], [str(tmp_path / "sweep" / "1_lr=1")]]
    assert one.files.payload == tmp_path / "sweep" / ".hpctrain" / "submission-0.pkl"
    assert one.files.runs.name == "submission-0.runs.json"


def test_the_run_list_names_each_tasks_run_dirs(tmp_path):
    packed = _submission(tmp_path, Calling.PACK, per_task=2)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(packed.runs_json()))
    assert task_run_dirs(path, 0) == [packed.runs[0].run_dir, packed.runs[1].run_dir]
    assert task_run_dirs(path, 1) == [packed.runs[2].run_dir]
    assert task_run_dirs(path, 2) == []
    path.write_text(json.dumps(["/s/a", ["/s/b", "/s/c"]]))  # a submission made before run lists held RunSpecs
    assert task_run_dirs(path, 0) == [Path("/s/a")] and task_run_dirs(path, 1) == [Path("/s/b"), Path("/s/c")]


def test_a_dry_run_renders_the_runs(tmp_path):
    text = _submission(tmp_path, Calling.PACK, per_task=2).render()
    assert text.splitlines()[1] == "runs (3 to submit as 2 task(s), 0 already completed):"
    assert text.splitlines()[2] == f"     0  {tmp_path / 'sweep' / '0_lr=0'}"
