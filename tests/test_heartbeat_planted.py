"""/dev/shm is every user's: a heartbeat dir another user planted there (or a link) is neither written into nor
read, so no stack lands in a file of theirs and no pid of theirs is signalled by the watchdog (issue 28's rule
for shared places, applied to the hang heartbeat)."""

import os
from pathlib import Path

import pytest

from hpctrain.job import heartbeat

OTHER = 65534  # nobody: the test runs as root and plays another user by chown


def _planted(path: Path) -> Path:
    path.mkdir(mode=0o777)
    os.chmod(path, 0o777)
    os.chown(path, OTHER, OTHER)
    return path


@pytest.fixture
def env_dir(monkeypatch):
    def point_at(directory: Path) -> None:
        monkeypatch.setenv(heartbeat.DIR_ENV, str(directory))
    return point_at


def test_a_root_planted_by_another_user_is_refused_with_one_line_and_nothing_written(tmp_path, env_dir, capsys):
    root = _planted(tmp_path / "hpctrain-0")
    env_dir(root / "attempt")
    heart = heartbeat.for_this_rank(0, 0)
    assert isinstance(heart, heartbeat.NoHeart)
    assert list(root.iterdir()) == []
    err = capsys.readouterr().err
    assert "no heartbeat, the hang watchdog cannot see this rank" in err and "belongs to" in err, err


def test_a_root_that_is_a_link_is_refused(tmp_path, env_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "hpctrain-0").symlink_to(elsewhere)
    env_dir(tmp_path / "hpctrain-0" / "attempt")
    assert isinstance(heartbeat.for_this_rank(0, 0), heartbeat.NoHeart)
    assert list(elsewhere.iterdir()) == []


def test_an_own_root_left_open_to_others_is_closed_and_used(tmp_path, env_dir):
    root = tmp_path / "hpctrain-0"
    root.mkdir()
    os.chmod(root, 0o777)
    env_dir(root / "attempt")
    heart = heartbeat.for_this_rank(0, 0)
    try:
        assert isinstance(heart, heartbeat.Heart)
        assert os.stat(root).st_mode & 0o777 == 0o700 and os.stat(root / "attempt").st_mode & 0o777 == 0o700
        assert heartbeat.beats(root / "attempt") == [heart.path]
    finally:
        heart.close()


def test_the_watchdog_reads_no_beat_from_a_dir_another_user_can_write(tmp_path):
    root = tmp_path / "hpctrain-0"
    root.mkdir(mode=0o700)
    theirs = _planted(root / "attempt")  # theirs, inside ours
    (theirs / "rank0-1.beat").write_bytes(b"\0" * heartbeat.SIZE)
    assert heartbeat.beats(theirs) == []
    mine_in_theirs = _planted(tmp_path / "open") / "attempt"
    mine_in_theirs.mkdir(mode=0o700)
    os.chmod(mine_in_theirs, 0o700)
    (mine_in_theirs / "rank0-1.beat").write_bytes(b"\0" * heartbeat.SIZE)
    assert heartbeat.beats(mine_in_theirs) == []  # its parent is theirs: they could swap it
    group_writable = root / "shared"
    group_writable.mkdir()
    os.chmod(group_writable, 0o770)
    (group_writable / "rank0-1.beat").write_bytes(b"\0" * heartbeat.SIZE)
    assert heartbeat.beats(group_writable) == []


def _dump_into(run_dir: Path, tmp_path: Path) -> list:
    from hpctrain.job import watchdog

    attempt = tmp_path / "shm" / "attempt"
    os.environ[heartbeat.DIR_ENV] = str(attempt)
    try:
        heart = heartbeat.for_this_rank(0, 0)
    finally:
        del os.environ[heartbeat.DIR_ENV]
    assert isinstance(heart, heartbeat.Heart)
    try:
        beat = heartbeat.read(heart.path)
        assert beat is not None
        dog = watchdog.Watchdog(watchdog.WatchSettings(str(attempt), str(run_dir), os.getpid(), node="n1"))
        dog.dump([watchdog.Watch(heart.path, beat, 0.0)])  # this process's own stack, by the dump signal
        return list(dog.stack_paths.values())
    finally:
        heart.close()


def test_stacks_go_into_the_run_dir_but_never_through_a_planted_link(tmp_path, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (copied,) = _dump_into(run_dir, tmp_path)
    assert copied.parent == run_dir / "stacks" and "test_stacks_go_into_the_run_dir" in copied.read_text()
    planted_run, elsewhere = tmp_path / "run2", tmp_path / "theirs"
    planted_run.mkdir()
    elsewhere.mkdir()
    (planted_run / "stacks").symlink_to(elsewhere)
    assert _dump_into(planted_run, tmp_path / "second") == []
    assert list(elsewhere.iterdir()) == []
    assert "cannot write the stack of rank 0" in capfd.readouterr().err
