"""The study's file locks (hpctrain.search.journal.PromptOpenLock): one holder at a time, a waiter gets the
lock once it is released, and a lock file left by a killed process is broken after the grace period."""

import os
import threading

from hpctrain._compat.optuna import lock_file
from hpctrain.core.paths import SweepPaths
from hpctrain.search import claims
from hpctrain.search.journal import PromptOpenLock, RepairingOpenLock


def test_one_holder_at_a_time_and_the_waiter_gets_it_after_the_release(tmp_path):
    order = []
    holder, waiter = (PromptOpenLock(str(tmp_path / "x"), grace_period=30) for _ in range(2))
    holder.acquire()
    got = threading.Event()

    def wait() -> None:
        waiter.acquire()
        order.append("waiter")
        got.set()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    assert not got.wait(0.2)  # held: the waiter waits
    order.append("released")
    holder.release()
    assert got.wait(30)
    assert order == ["released", "waiter"]
    waiter.release()
    assert not os.path.exists(lock_file(waiter))


def test_a_lock_left_by_a_killed_process_is_broken_after_the_grace_period(tmp_path):
    lock = PromptOpenLock(str(tmp_path / "x"), grace_period=1)
    open(lock_file(lock), "w").close()  # its holder died holding it
    done = threading.Event()
    threading.Thread(target=lambda: (lock.acquire(), done.set()), daemon=True).start()
    assert done.wait(30)
    lock.release()


def test_the_journal_lock_and_the_trials_lock_are_prompt_locks(tmp_path, monkeypatch):
    assert issubclass(RepairingOpenLock, PromptOpenLock)
    taken = []
    acquire = PromptOpenLock.acquire
    monkeypatch.setattr(PromptOpenLock, "acquire", lambda self: taken.append(lock_file(self)) or acquire(self))
    os.makedirs(SweepPaths(tmp_path).hpctrain)
    with claims.trials_lock(tmp_path):
        assert taken == [str(SweepPaths(tmp_path).trials) + ".lock"] and os.path.exists(taken[0])
    assert not os.path.exists(taken[0])
