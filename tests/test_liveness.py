"""One rule for "is this process alive" (hpctrain.core.liveness), shared by the local launcher, review and
the search's leases: a zombie has ended, a pid reused by a later process is not the recorded one."""

import os
import subprocess
import sys
import time

from hpctrain.core import liveness
from hpctrain.core.liveness import Liveness


def test_a_running_process_is_alive_and_a_reused_pid_is_not():
    me = os.getpid()
    assert liveness.process(me) is Liveness.ALIVE
    assert liveness.process(str(me), started_by=time.time(), needle="python") is Liveness.ALIVE
    # recorded an hour before this process started: the pid names a later process
    started = __import__("psutil").Process(me).create_time()
    assert liveness.process(me, started_by=started - 3600) is Liveness.GONE
    assert liveness.process(me, needle="submitit") is Liveness.GONE  # not the command that was recorded


def test_a_zombie_an_ended_process_and_a_job_id_are_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while liveness.process(child.pid) is Liveness.ALIVE and time.time() < deadline:
        time.sleep(0.05)
    assert liveness.process(child.pid) is Liveness.GONE  # exited, not yet reaped: a zombie
    child.wait()
    assert liveness.process(child.pid) is Liveness.GONE
    assert liveness.process("1234_0") is Liveness.GONE  # a Slurm job id is no local process


def test_the_launcher_review_and_leases_answer_alike(tmp_path):
    from hpctrain.review import jobs
    from hpctrain.search import leases
    from hpctrain.submit.launcher import BaseLauncher

    sleeper = subprocess.Popen(["sleep", "30"])  # a pid whose command is no submitit controller
    try:
        pid = str(sleeper.pid)
        in_queue = BaseLauncher.in_queue(None, [pid, str(os.getpid())])  # type: ignore[arg-type]
        assert in_queue == set() and not jobs.pid_alive(pid) and jobs.pid_alive(str(os.getpid()), "python")
        assert leases.process_state(sleeper.pid, time.time()) is Liveness.ALIVE
        assert leases.process_state(sleeper.pid, time.time() - 3600) is Liveness.GONE  # a reused pid
    finally:
        sleeper.kill()
        sleeper.wait()
    assert leases.process_state(sleeper.pid, time.time()) is Liveness.GONE
