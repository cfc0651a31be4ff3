"""A resumed run's TensorBoard file sorts after the files it supersedes (TensorBoard reads them by name)."""

import logging

from hpctrain.train.loggers import after_older_event_files


class Clock:
    def __init__(self, now: float) -> None:
        self.now, self.slept = now, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_a_writer_opened_in_the_same_second_as_the_last_file_waits_for_the_next_second(tmp_path):
    (tmp_path / "events.out.tfevents.1000.hostb.99999.0").write_bytes(b"")
    (tmp_path / "events.out.tfevents.0999.hosta.11111.0").write_bytes(b"")
    clock = Clock(1000.4)
    after_older_event_files(tmp_path, clock, clock.sleep)
    assert len(clock.slept) == 1 and abs(clock.slept[0] - 0.6) < 1e-9 and int(clock.now) == 1001


def test_no_wait_when_the_last_file_is_older_or_there_is_none(tmp_path):
    clock = Clock(1000.4)
    after_older_event_files(tmp_path / "missing", clock, clock.sleep)
    after_older_event_files(tmp_path, clock, clock.sleep)
    (tmp_path / "events.out.tfevents.999.host.1.0").write_bytes(b"")
    (tmp_path / "events.out.tfevents.2000.host.1.0.sys").write_bytes(b"")  # not an older file's name: .sys too
    (tmp_path / "notes.txt").write_bytes(b"")
    clock.now = 2001.0
    after_older_event_files(tmp_path, clock, clock.sleep)
    assert clock.slept == []


def test_a_clock_far_behind_is_said_not_waited_for(tmp_path, caplog):
    (tmp_path / "events.out.tfevents.1600.host.1.0").write_bytes(b"")
    clock = Clock(1000.0)
    with caplog.at_level(logging.WARNING):
        after_older_event_files(tmp_path, clock, clock.sleep)
    assert clock.slept == [] and "clock is 601 s behind" in caplog.text
