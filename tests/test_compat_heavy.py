"""Canaries for the private names of torch.distributed, TensorBoard and Optuna (hpctrain/_compat/): each
test fails when a release renames one of them or changes what hpctrain relies on it for.

Not login-marked: these need torch or Optuna (test_compat.py holds the login-node ones).
"""

import inspect
import os

import pytest

from hpctrain._compat import optuna as optuna_compat
from hpctrain._compat import tensorboard as tb_compat


# ------------------------------------------------------------------ torch.distributed
def test_abort_process_group_takes_an_optional_group():
    from torch.distributed import distributed_c10d

    params = inspect.signature(distributed_c10d._abort_process_group).parameters
    assert list(params) == ["group"] and params["group"].default is None


def test_abort_process_groups_leaves_no_process_group(tmp_path):
    """On gloo (one rank): after the abort nothing is initialized, and a new group can be made (as a
    requeued run does in a fresh process; here the same one)."""
    import torch.distributed as dist

    from hpctrain._compat.torch import abort_process_groups

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.is_initialized()
        abort_process_groups()
        assert not dist.is_initialized()
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store2'}", rank=0, world_size=1)
        assert dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ------------------------------------------------------------------ TensorBoard (torch.utils.tensorboard)
def test_file_writer_adds_summaries_that_tensorboard_reads(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    writer = SummaryWriter(str(tmp_path))
    try:
        file_writer = tb_compat.file_writer(writer)
        assert file_writer is tb_compat.file_writer(writer)  # one FileWriter per SummaryWriter
        assert file_writer.get_logdir() == str(tmp_path)
        for summary in hparams({"lr": 0.1}, {"loss": 0.0}):
            file_writer.add_summary(summary)
        writer.flush()
    finally:
        writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert set(acc.PluginTagToContent("hparams")) == {"_hparams_/experiment", "_hparams_/session_start_info",
                                                       "_hparams_/session_end_info"}


# ------------------------------------------------------------------ Optuna
@pytest.fixture
def study(tmp_path):
    import optuna

    from hpctrain.search.study import storage

    return optuna.create_study(storage=storage(tmp_path), study_name="canary", direction="minimize")


def test_trial_id_is_the_storages_id_of_a_trial_and_of_its_frozen_copy(study):
    study.ask()
    trial = study.ask()
    tid = optuna_compat.trial_id(trial)
    assert isinstance(tid, int)
    assert study._storage.get_trial(tid).number == trial.number == 1
    frozen = study.get_trials(deepcopy=False)[1]
    assert optuna_compat.trial_id(frozen) == tid


def test_live_trial_reports_to_the_running_trial(study):
    trial = study.ask()
    live = optuna_compat.live_trial(study, optuna_compat.trial_id(trial))
    live.report(0.5, step=3)
    assert live.number == trial.number
    assert study.get_trials()[0].intermediate_values == {3: 0.5}
    assert live.should_prune() in (True, False)


def test_set_trial_system_attr_on_a_running_trial_only(study):
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    trial = study.ask()
    tid = optuna_compat.trial_id(study.get_trials()[0])
    optuna_compat.set_trial_system_attr(study, tid, "hpctrain:failed", "why")
    study.tell(trial.number, state=TrialState.FAIL)
    assert study.get_trials()[0].system_attrs["hpctrain:failed"] == "why"
    with pytest.raises(UpdateFinishedTrialError):  # hence: the reason first, then the tell
        optuna_compat.set_trial_system_attr(study, tid, "hpctrain:failed", "again")


def test_settle_failed_records_the_reason_and_leaves_a_settled_trial_alone(study):
    from optuna.trial import TrialState

    from hpctrain.search.study import settle_failed

    study.ask()
    settle_failed(study, study.get_trials()[0], "its worker died 2 time(s) while running it")
    done = study.get_trials()[0]
    assert done.state == TrialState.FAIL
    assert done.system_attrs["hpctrain:failed"] == "its worker died 2 time(s) while running it"
    settle_failed(study, done, "again")  # settled already (by another worker): nothing changes, no error
    assert study.get_trials()[0].system_attrs["hpctrain:failed"] == "its worker died 2 time(s) while running it"


def test_lock_file_is_the_file_optunas_open_lock_creates(tmp_path):
    from optuna.storages.journal import JournalFileOpenLock

    lock = JournalFileOpenLock(str(tmp_path / "x"), grace_period=30)
    path = optuna_compat.lock_file(lock)
    JournalFileOpenLock.acquire(lock)  # Optuna's own acquire
    assert os.path.exists(path) and os.path.dirname(path) == str(tmp_path)
    lock.release()
    assert not os.path.exists(path)
