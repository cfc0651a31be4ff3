"""``cancel`` signals a local sweep's recorded launcher pid only while that pid is still the launcher: a pid
held now by an unrelated ``python`` process (a reused pid, or a record naming another live process) is left
alone. Real processes and a real sweep dir; nothing mocked."""

import subprocess
import sys
import time
from pathlib import Path

from hpctrain.core import launcher_id, manifest
from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.run import RunSpec

from cli_helpers import run_hpctrain


def _unrelated_python() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _local_sweep(sweep: Path, pid: int) -> None:
    """A local sweep whose launcher was ``pid`` and whose one run has not started."""
    run_dir = sweep / "0"
    run_dir.mkdir(parents=True)

    def add(m: manifest.Manifest) -> None:
        m.launcher, m.launcher_pid = "local", pid
        m.submissions.append(manifest.SubmissionRecord(runs=[0], launcher_pid=pid))
        m.runs[0] = manifest.RunEntry(RunSpec(0, ("lr=0.1",), run_dir, 10))

    manifest.update(sweep, add)


def test_a_reused_launcher_pid_held_by_an_unrelated_python_is_not_signalled(tmp_path):
    notebook = _unrelated_python()
    try:
        time.sleep(0.2)
        sweep = tmp_path / "sweep"
        _local_sweep(sweep, notebook.pid)
        # the launcher that recorded this pid was another process: same pid, other start time and argv
        write_json_atomic(launcher_id.record_path(sweep), {"pid": notebook.pid, "start": 1,
                                                           "argv_sha256": "0" * 64})
        assert launcher_id.verified(sweep, notebook.pid) is None
        proc = run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        time.sleep(0.5)
        assert notebook.poll() is None, "an unrelated process holding the recorded pid was killed"
    finally:
        notebook.kill()
        notebook.wait()


def test_a_sweep_recording_another_live_pid_without_its_identity_does_not_kill_it(tmp_path):
    notebook = _unrelated_python()
    try:
        sweep = tmp_path / "sweep"
        _local_sweep(sweep, notebook.pid)  # no launcher.json: an older sweep, or a sweep file from a colleague
        proc = run_hpctrain(["cancel", str(sweep)], cwd=tmp_path, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        time.sleep(0.5)
        assert notebook.poll() is None
    finally:
        notebook.kill()
        notebook.wait()


def test_the_same_pid_and_start_time_with_another_command_line_is_not_the_launcher(tmp_path):
    notebook = _unrelated_python()
    try:
        time.sleep(0.2)
        me = launcher_id.identity(notebook.pid)
        assert me is not None
        write_json_atomic(launcher_id.record_path(tmp_path), {**me, "argv_sha256": "f" * 64})
        assert launcher_id.verified(tmp_path, notebook.pid) is None
        write_json_atomic(launcher_id.record_path(tmp_path), me)
        assert launcher_id.verified(tmp_path, notebook.pid) == notebook.pid
    finally:
        notebook.kill()
        notebook.wait()


def test_the_launcher_itself_is_recognised(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from hpctrain.core import launcher_id; "
                             "launcher_id.record(sys.argv[1]); print('recorded', flush=True); time.sleep(60)",
                             str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "recorded"
        assert launcher_id.verified(tmp_path, proc.pid) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert launcher_id.verified(tmp_path, proc.pid) is None  # gone
