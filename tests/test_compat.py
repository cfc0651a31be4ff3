"""Canaries for the private names of Hydra, OmegaConf and submitit (hpctrain/_compat/): each test fails when
a release renames one of them or changes what hpctrain relies on it for.

Login-node names only (no torch, no Optuna, no TensorBoard: those are in test_compat_heavy.py), so that
``.ci/pins`` runs these against the oldest and the newest supported hydra-core and omegaconf.
"""

import inspect
import os
import pickle
import signal
import sys
import types
from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from hpctrain._compat import hydra as hydra_compat
from hpctrain._compat import omegaconf as omegaconf_compat
from hpctrain._compat import submitit as submitit_compat

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra


def _parse(*overrides: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


# ------------------------------------------------------------------ Hydra
def test_basic_sweeper_is_a_sweeper_that_validates_through_the_hook_hpctrain_overrides():
    from hydra.plugins.sweeper import Sweeper

    assert issubclass(hydra_compat.BasicSweeper, Sweeper)
    assert list(inspect.signature(hydra_compat.BasicSweeper.validate_batch_is_legal).parameters) == ["self", "batch"]
    # HpctrainSweeper skips the up-front composition by overriding the hook; it only works if sweep() calls it
    assert "self.validate_batch_is_legal(" in inspect.getsource(hydra_compat.BasicSweeper.sweep)
    assert "self.launcher" in inspect.getsource(hydra_compat.BasicSweeper.setup)


def test_basic_sweeper_split_arguments_expands_a_sweep_as_review_reads_it():
    batches = hydra_compat.BasicSweeper.split_arguments(_parse("a=1,2", "b=x"), None)
    assert [list(run) for batch in batches for run in batch] == [["a=1", "b=x"], ["a=2", "b=x"]]


@dataclass
class _Typed:
    lr: float = 0.1
    name: str = "n"


def test_apply_overrides_sets_values_with_the_structured_config_type_checks():
    cfg = OmegaConf.structured(_Typed)
    hydra_compat.apply_overrides(_parse("lr=0.5", "name=m"), cfg)
    assert (cfg.lr, cfg.name) == (0.5, "m")
    with pytest.raises(Exception, match="lr"):
        hydra_compat.apply_overrides(_parse("lr=fast"), cfg)


def test_get_overrides_dirname_takes_the_keywords_plan_passes_and_sorts():
    names = list(inspect.signature(hydra_compat.get_overrides_dirname).parameters)
    assert set(names) == {"overrides", "exclude_keys", "item_sep", "kv_sep"}
    out = hydra_compat.get_overrides_dirname(overrides=_parse("b=2", "a=1", "c=3"), kv_sep="=", item_sep=",",
                                             exclude_keys=["c"])
    assert out == "a=1,b=2"


@pytest.fixture
def hydra_loader(tmp_path):
    """Hydra's own config loader over a config dir holding ``config.yaml`` and a ``model`` group."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - model: a\n  - _self_\nlr: 0.1\n")
    (conf / "model" / "a.yaml").write_text("width: 8\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        yield GlobalHydra.instance().config_loader(), conf


def test_group_checker_tells_groups_from_keys(hydra_loader):
    loader, _ = hydra_loader
    exists = hydra_compat.group_checker(loader)
    assert exists("model") and not exists("lr") and not exists("width")
    assert hydra_compat.group_checker(object())("model") is False  # a loader that is not Hydra's


def test_search_path_copy_relocated_makes_a_loader_that_reads_the_new_place(hydra_loader, tmp_path):
    import copy
    import shutil

    from hydra.types import RunMode

    loader, conf = hydra_loader
    path = hydra_compat.search_path_of(loader)
    assert path is not None and path is loader.get_search_path()
    moved = tmp_path / "snapshot"
    shutil.copytree(conf, moved)
    (moved / "config.yaml").write_text("defaults:\n  - model: a\n  - _self_\nlr: 0.7\n")
    relocated = copy.deepcopy(path)
    hits = [e for e in relocated.get_path() if (e.path or "").endswith(str(conf))]
    assert hits, [e.path for e in relocated.get_path()]
    for element in hits:
        element.path = f"file://{moved}"
    cfg = hydra_compat.config_loader(relocated).load_configuration("config", [], RunMode.RUN)
    assert cfg.lr == 0.7 and cfg.model.width == 8
    assert loader.load_configuration("config", [], RunMode.RUN).lr == 0.1  # the original is untouched


def test_stored_value_gives_a_failed_jobs_exception_without_raising():
    from hydra.core.utils import JobReturn, JobStatus

    error = ValueError("boom")
    ret = JobReturn(overrides=["a=1"], status=JobStatus.FAILED)
    ret.return_value = error  # the public setter stores what stored_value reads
    assert hydra_compat.stored_value(ret) is error
    with pytest.raises(ValueError, match="boom"):
        _ = ret.return_value
    done = JobReturn(status=JobStatus.COMPLETED)
    assert hydra_compat.stored_value(done) is None  # the default, as a placeholder is made
    done.return_value = {"loss": 1.0}
    assert hydra_compat.stored_value(done) == done.return_value == {"loss": 1.0}


# ------------------------------------------------------------------ OmegaConf
@pytest.fixture
def counted_parser(monkeypatch):
    """omegaconf.base.parse wrapped by a counter of its calls (the memo is applied over it)."""
    import omegaconf.base as ombase

    calls = []
    original = ombase.parse

    def counting(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("value"))
        return original(*args, **kwargs)

    monkeypatch.setattr(ombase, "parse", counting)
    return calls


def _resolve_twice(text: str) -> list:
    return [OmegaConf.create({"a": a, "b": text}).b for a in (1, 2)]


def test_omegaconf_resolves_each_interpolation_through_base_parse(counted_parser):
    assert _resolve_twice("${a}") == [1, 2]
    assert counted_parser.count("${a}") == 2  # else the memo below has nothing to take effect on


def test_interpolation_parser_memo_takes_effect(counted_parser):
    with omegaconf_compat.interpolation_parser_memoized():
        assert _resolve_twice("${a}") == [1, 2]  # each config resolves its own value from the shared tree
        assert _resolve_twice("x_${a}") == ["x_1", "x_2"]
    assert counted_parser.count("${a}") == 1 and counted_parser.count("x_${a}") == 1
    _resolve_twice("${a}")
    assert counted_parser.count("${a}") == 3  # off after the block: the original parser again


# ------------------------------------------------------------------ submitit
def test_convert_mem_formats_sbatch_mem():
    assert submitit_compat.convert_mem(2.5) == "2560MB"
    assert submitit_compat.convert_mem(16) == "16GB"


def test_make_sbatch_string_takes_every_parameter_hpctrain_passes():
    from hpctrain.submit.backends.slurm import SBATCH_NAMES
    from submitit.slurm import slurm as submitit_slurm

    accepted = set(inspect.signature(submitit_slurm._make_sbatch_string).parameters)
    passed = set(SBATCH_NAMES.values()) | {"setup", "teardown", "map_count", "command", "folder"}
    assert passed <= accepted, passed - accepted


def test_submitits_script_puts_setup_before_and_teardown_right_after_srun(tmp_path):
    executor = {"folder": str(tmp_path), "python": "python"}
    text = submitit_compat.sbatch_script(executor, {"partition": "p", "mem": "2560MB", "setup": ["echo setup"],
                                                    "teardown": ["hpctrain_rc=$?"], "array_parallelism": 2,
                                                    "srun_args": ["--kill-on-bad-exit=1"]}, 3)
    lines = text.splitlines()
    assert {"#SBATCH --partition=p", "#SBATCH --mem=2560MB", "#SBATCH --array=0-2%2"} <= set(lines)
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert "-u -m submitit.core._submit" in lines[srun] and "--kill-on-bad-exit=1" in lines[srun]
    assert lines.index("echo setup") < srun
    after = [line for line in lines[srun + 1:] if line.strip() and not line.startswith("#")]
    assert after[0] == "hpctrain_rc=$?"  # $? is srun's status: the teardown's first line must come first


def test_preemption_signal_is_usr2_by_default(monkeypatch):
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    assert submitit_compat.preemption_signal() == signal.SIGUSR2


class _Checkpointable:
    def __call__(self, x: int) -> int:
        return x

    def checkpoint(self, x: int):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(_Checkpointable(), x + 1)


def test_checkpoint_for_requeue_writes_the_next_attempts_pickle_and_requeues_nothing(tmp_path):
    """As submitit's USR2 handler before its ``scontrol requeue``: the job's checkpoint(), then its pickle."""
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths

    paths = JobPaths(tmp_path, job_id="1234", task_id=0)
    delayed = DelayedSubmission(_Checkpointable(), 1)
    delayed.set_timeout(10, 3)
    env = types.SimpleNamespace(_requeue=lambda countdown: pytest.fail("requeued"))
    handler = SignalHandler(env, paths, delayed)  # type: ignore[arg-type]
    submitit_compat.checkpoint_for_requeue(handler.checkpoint_and_try_requeue)
    again = DelayedSubmission.load(paths.submitted_pickle)
    assert again.args == (2,) and again._timeout_countdown == 3


def test_requeue_through_makes_submitits_handler_requeue_by_the_given_call(tmp_path, monkeypatch):
    """The USR2 handler checkpoints, then calls its environment's ``_requeue(countdown)``, the one place
    submitit runs ``scontrol requeue``: hpctrain puts the host side's requeue there (issue 27)."""
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths

    paths = JobPaths(tmp_path, job_id="1234", task_id=0)
    delayed = DelayedSubmission(_Checkpointable(), 1)
    delayed.set_timeout(60, 3)  # an hour's limit: not timed out yet, the countdown stays
    env = types.SimpleNamespace(_requeue=lambda countdown: pytest.fail("submitit's own scontrol"), global_rank=0)
    handler = SignalHandler(env, paths, delayed)  # type: ignore[arg-type]
    asked = []
    submitit_compat.requeue_through(handler.checkpoint_and_try_requeue, asked.append)
    with pytest.raises(SystemExit):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert asked == [3]  # not timed out: the countdown as it was
    assert DelayedSubmission.load(paths.submitted_pickle).args == (2,)


@pytest.mark.parametrize("job_id", ["1234", "1234_7"])
def test_file_names_are_submitits_job_paths(tmp_path, job_id):
    from submitit.core.utils import JobPaths

    paths = JobPaths(tmp_path, job_id=job_id, task_id=0)
    assert submitit_compat.log_path(tmp_path, job_id) == str(paths.stdout)
    assert submitit_compat.log_path(tmp_path, job_id, "err") == str(paths.stderr)
    assert submitit_compat.result_path(tmp_path, job_id) == str(paths.result_pickle)


def test_local_jobs_leave_results_whose_outcome_is_read_and_an_exit_code(tmp_path):
    """A real round trip: submitit's local executor runs a job that returns and one that raises."""
    from submitit import LocalExecutor

    executor = LocalExecutor(folder=tmp_path)
    executor.update_parameters(timeout_min=2)
    good, bad = executor.submit(int, "7"), executor.submit(int, "seven")
    assert good.result() == 7
    with pytest.raises(Exception):
        bad.result()
    for job, outcome in ((good, "success"), (bad, "error")):
        assert submitit_compat.result_path(tmp_path, job.job_id) == str(job.paths.result_pickle)
        assert submitit_compat.log_path(tmp_path, job.job_id, "err") == str(job.paths.stderr)
        assert submitit_compat.result_outcome(tmp_path, job.job_id) == outcome
        with open(job.paths.result_pickle, "rb") as f:
            assert pickle.load(f)[0] == outcome  # what submitit's own reader gets
        job.wait()
        code = submitit_compat.local_job_exit_code(job)
        assert isinstance(code, int), code
    assert submitit_compat.local_job_exit_code(good) == 0
    assert submitit_compat.local_job_exit_code(object()) is None


def test_result_outcome_never_unpickles(tmp_path, monkeypatch):
    from submitit.core.utils import cloudpickle_dump

    module = types.ModuleType("hpctrain_gone_module")
    exec("class Heavy:\n    pass\n", module.__dict__)
    module.Heavy.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cloudpickle_dump(("success", module.Heavy()), tmp_path / "5_0_result.pkl")
    monkeypatch.delitem(sys.modules, module.__name__)  # unpickling it would now fail
    with pytest.raises(ModuleNotFoundError):
        with open(tmp_path / "5_0_result.pkl", "rb") as f:
            pickle.load(f)
    assert submitit_compat.result_outcome(tmp_path, "5") == "success"
    (tmp_path / "6_0_result.pkl").write_bytes(pickle.dumps(("success", 1))[:3])  # torn
    assert submitit_compat.result_outcome(tmp_path, "6") is None
    assert submitit_compat.result_outcome(tmp_path, "7") is None  # none
    cloudpickle_dump(("error", "Traceback ... success"), tmp_path / "8_0_result.pkl")
    assert submitit_compat.result_outcome(tmp_path, "8") == "error"


def test_login_node_compat_modules_import_nothing_heavy():
    import subprocess

    code = ("import sys, hpctrain._compat.hydra, hpctrain._compat.omegaconf, hpctrain._compat.submitit, "
            "hpctrain._compat.optuna, hpctrain._compat.tensorboard, hpctrain.review.jobs; "
            "print(sorted(m for m in ('torch', 'optuna', 'tensorboard') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_node_flag_is_a_nodes_own_flag_not_the_inherited_one():
    cfg = OmegaConf.create({"a": {"b": 1}})
    OmegaConf.set_readonly(cfg, True)
    assert omegaconf_compat.node_flag(cfg, "readonly") is True and omegaconf_compat.node_flag(cfg.a, "readonly") is None
    OmegaConf.set_readonly(cfg.a, False)
    assert omegaconf_compat.node_flag(cfg.a, "readonly") is False


def test_unsent_scripts_are_the_submission_files_submitit_wrote_and_never_moved(tmp_path):
    """submitit writes ``.submission_file_<uuid>.sh`` before sbatch and moves it (a symlink left behind) once
    sbatch answered: a plain file left there is an sbatch whose job id it never took in."""
    from submitit.core.core import PicklingExecutor as Executor

    assert ".submission_file_" in inspect.getsource(Executor._submit_command)
    assert "keep_as_symlink=True" in inspect.getsource(Executor._submit_command)
    folder = tmp_path / "submitit"
    folder.mkdir()
    (folder / ".submission_file_aa.sh").write_text("#!/bin/sh\n")
    (folder / "12_submission.sh").write_text("#!/bin/sh\n")
    (folder / ".submission_file_bb.sh").symlink_to(folder / "12_submission.sh")
    assert submitit_compat.unsent_scripts(str(folder / "%j")) == [str(folder / ".submission_file_aa.sh")]
