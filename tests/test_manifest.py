"""sweep.json as dataclasses: the run entries' one form, old manifests, and the one locked update."""

import json
import multiprocessing
from pathlib import Path

import pytest

from hpctrain.core import manifest
from hpctrain.core.run import RunSpec

pytestmark = pytest.mark.login

OLD = {  # as the launcher wrote it before RunSpec (entries keyed by str(idx), with a name and no idx)
    "launcher": "slurm", "app": "hpctrain.app", "submitit_folder": "/x/.submitit", "launcher_pid": 42,
    "submissions": [{"time": 1.0, "job_ids": ["7"], "runs": [0, 1], "launcher_pid": 42}],
    "runs": {"0": {"name": "0_lr=1", "run_dir": "0_lr=1", "overrides": ["lr=1"], "job_id": "7_0", "max_steps": 10},
             "1": {"name": "1_lr=2", "run_dir": "1_lr=2", "overrides": ["lr=2"], "job_id": None, "max_steps": None}},
}


def test_an_old_manifest_reads(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps(OLD))
    m = manifest.read(tmp_path)
    assert m.launcher == "slurm" and m.launcher_pid == 42 and m.submissions[0].job_ids == ["7"]
    first = m.runs[0]
    assert first.name == "0_lr=1" and first.job_id == "7_0" and first.spec.max_steps == 10
    assert first.spec.run_dir == (tmp_path / "0_lr=1").absolute() and first.spec.overrides == ("lr=1",)
    assert m.runs[1].job_id is None


def test_entries_are_runspecs_plus_their_job_id_and_round_trip(tmp_path):
    spec = RunSpec(3, ("lr=0.1",), tmp_path / "3_lr=0.1", 100)

    def add(m: manifest.Manifest) -> None:
        m.launcher = "local"
        m.runs[3] = manifest.RunEntry(spec, "123", {"trial": 3, "params": {"lr": 0.1}})
        m.submissions.append(manifest.SubmissionRecord(runs=[3], extra={"workers": 1}))

    manifest.update(tmp_path, add)
    raw = json.loads((tmp_path / "sweep.json").read_text())
    assert raw["runs"]["3"] == {**spec.to_json(tmp_path), "job_id": "123", "trial": 3, "params": {"lr": 0.1}}
    assert raw["submissions"][0]["workers"] == 1 and "search" not in raw
    again = manifest.read(tmp_path)
    assert again.runs[3].spec == spec and again.runs[3].extra == {"trial": 3, "params": {"lr": 0.1}}
    assert again.to_json(tmp_path) == raw


def test_unknown_keys_are_kept(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({**OLD, "future": {"x": 1}}))
    manifest.update(tmp_path, lambda m: None)
    assert json.loads((tmp_path / "sweep.json").read_text())["future"] == {"x": 1}


def _add_runs(sweep_dir: str, first: int, n: int) -> None:
    for i in range(first, first + n):
        def add(m: manifest.Manifest, i: int = i) -> None:
            m.runs[i] = manifest.RunEntry(RunSpec(i, (f"x={i}",), Path(sweep_dir) / str(i)), str(i))
            m.last_submission().job_ids.append(str(i))
        manifest.update(sweep_dir, add)


def test_concurrent_writers_lose_no_entry(tmp_path):
    """Two processes (the launcher recording job ids, a search worker registering trials) at once."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_add_runs, args=(str(tmp_path), k * 1000, 60)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    m = manifest.read(tmp_path)
    assert sorted(m.runs) == list(range(60)) + list(range(1000, 1060))
    assert len(m.submissions) == 1 and len(m.submissions[0].job_ids) == 120
