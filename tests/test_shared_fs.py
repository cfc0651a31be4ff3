"""A shared file system, played for real: a second local user in the victim's group, a setgid team
directory, umask 002. Each attack script (tests/attacks/, run as the other user with ``runuser``) fails:
no code of theirs lands where the victim's jobs load it, no planted link is written through or copied into
a report, the snapshot holds no secret file, and a sweep dir they prepared is refused in one line.
"""

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from cli_helpers import ROOT, hpctrain_env

ATTACKS = ROOT / "tests" / "attacks"
SECRETS = {".env": "WANDB_API_KEY=s3cret\n", "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
           "server.pem": "-----BEGIN PRIVATE KEY-----\n", "credentials.json": '{"key": "s3cret"}\n',
           ".netrc": "machine x login me password s3cret\n", "secrets.yaml": "token: s3cret\n",
           "deploy.key": "s3cret\n", ".aws/credentials": "[default]\naws_secret_access_key=s3cret\n"}


@pytest.fixture(scope="module")
def other():
    """A second user and a group holding both users, removed afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.fail("these tests create a second local user: run them as root (as CI does)")
    tag = uuid.uuid4().hex[:6]
    user, group = f"hpcmate{tag}", f"hpcteam{tag}"
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(["useradd", "-M", "-N", "-g", group, "-s", "/bin/sh", user], check=True)
        try:
            top = Path(tempfile.mkdtemp(prefix="hpctrain-shared-"))
            top.chmod(0o755)
            team = top / "team"
            team.mkdir()
            os.chown(team, 0, grp.getgrnam(group).gr_gid)
            team.chmod(0o2775)  # a setgid project space the group writes into
            yield {"user": user, "group": group, "team": team, "uid": pwd.getpwnam(user).pw_uid}
        finally:
            shutil.rmtree(top, ignore_errors=True)
            subprocess.run(["userdel", "-f", user], check=False)
    finally:
        subprocess.run(["groupdel", group], check=False)


def as_other(other, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", other["user"], "--", "/usr/bin/python3", str(ATTACKS / script), *args],
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o002))


def victim(args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The victim's hpctrain command, umask 002 as on a group project space."""
    env = hpctrain_env({"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "tests" / "helpers")])})
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=lambda: os.umask(0o002))


def sweep_args(sweep: Path):
    return ["-m", "lr=0.01,0.3", "max_steps=10", "model._target_=test_review_helpers.LrBoom", "+model.boom_lr=0.3",
            "hydra/launcher=local", "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={sweep}"]


@pytest.fixture(scope="module")
def project(other):
    """The victim's git project in the team dir, untracked secret files in it, and one local sweep run
    from it (one run fails on purpose, so that a report shows its log)."""
    proj = other["team"] / "proj"
    proj.mkdir()
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / "mymodule.py").write_text("X = 1\n")
    for name, text in SECRETS.items():
        (proj / name).parent.mkdir(exist_ok=True)
        (proj / name).write_text(text)
    sweep = proj / "multirun" / "s1"
    proc = victim(sweep_args(sweep), proj)
    assert "Traceback" not in proc.stderr and (sweep / "sweep.json").exists(), proc.stdout + proc.stderr
    return {"dir": proj, "sweep": sweep, "proc": proc}


def test_no_module_pickle_or_dir_a_job_loads_can_be_replaced_by_the_group(other, project):
    sweep = project["sweep"]
    assert list(sweep.glob(".hpctrain/submission-*/code/**/*.py")) and list(sweep.glob(".hpctrain/*.pkl"))
    attack = as_other(other, "swap_code.py", str(sweep))
    assert attack.returncode == 0, attack.stderr
    assert json.loads(attack.stdout) == [], attack.stdout
    for path in [sweep / ".hpctrain", sweep / ".submitit", *sweep.glob(".hpctrain/submission-*/code/**/*")]:
        assert not path.stat().st_mode & 0o022 or path.is_symlink(), (path, oct(path.stat().st_mode))
    # what people read keeps the umask: a colleague reviews the runs
    metrics = next(sweep.glob("*/metrics.json"))
    assert metrics.stat().st_mode & 0o060 == 0o060, oct(metrics.stat().st_mode)


def test_the_snapshot_leaves_out_secret_files_and_says_so(project):
    code = next(project["sweep"].glob(".hpctrain/submission-*/code"))
    copied = [p for p in code.rglob("*") if p.is_file()]
    assert any(p.name == "mymodule.py" for p in copied), copied[:5]
    names = {p.name for p in copied} | {f"{p.parent.name}/{p.name}" for p in copied}
    assert not names & set(SECRETS), names & set(SECRETS)
    assert "named like secrets" in project["proc"].stderr and ".netrc" in project["proc"].stderr


def test_a_sweep_dir_another_user_prepared_is_refused_in_one_line(other, project):
    day = project["dir"] / "multirun" / "day2"
    pre = subprocess.run(["runuser", "-u", other["user"], "--", "mkdir", "-p", str(day)], capture_output=True,
                         text=True, preexec_fn=lambda: os.umask(0o002))
    assert pre.returncode == 0, pre.stderr
    proc = victim(sweep_args(day / "s"), project["dir"])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "nothing submitted" in line)
    assert f"belongs to {other['user']}, not to you" in line and str(day) in line, proc.stderr
    assert not (day / "s" / ".hpctrain").exists() and not list(day.rglob("*.pkl"))


def test_a_planted_lock_link_is_neither_followed_nor_truncated(other, project):
    mine = project["dir"] / "notes.txt"  # a file of the victim's the other user may not write
    mine.write_text("my notes\n")
    mine.chmod(0o644)
    sweep = project["dir"] / "multirun" / "s3"
    sweep.mkdir(parents=True)
    sweep.chmod(0o2775)  # the victim's own sweep dir, made (umask 002) before the sweep runs
    attack = as_other(other, "plant_links.py", "lock", str(sweep), str(mine))
    assert attack.returncode == 0, attack.stderr
    proc = victim(sweep_args(sweep), project["dir"])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert any("nothing submitted" in line and ".hpctrain" in line for line in proc.stderr.splitlines()), proc.stderr
    assert mine.read_text() == "my notes\n"


def test_a_lock_is_never_created_through_a_dangling_link(other, project, tmp_path):
    from hpctrain.core import atomic, safefs

    run_dir = project["dir"] / "multirun" / "s4" / "run0"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o2775)  # a run dir of the victim's, umask 002
    target = project["dir"] / "created-through-the-link"
    attack = as_other(other, "plant_links.py", "dangling", str(run_dir), "metrics.lock", str(target))
    assert attack.returncode == 0, attack.stderr
    with pytest.raises(safefs.UnsafeFile, match="symbolic link"):
        with atomic.locked(run_dir / "metrics.lock"):
            pass
    assert not target.exists()


def test_report_on_a_prepared_sweep_copies_no_file_a_planted_log_link_points_at(other, project):
    secret = project["dir"].parent.parent / "victims-secret.txt"  # outside the team dir, mode 600
    secret.write_text("TOPSECRET-do-not-copy\n")
    secret.chmod(0o600)
    theirs = other["team"] / "theirs"
    attack = as_other(other, "plant_links.py", "logs", str(project["sweep"]), str(theirs), str(secret))
    assert attack.returncode == 0, attack.stderr
    proc = victim(["report", str(theirs)], other["team"])
    assert "Traceback" not in proc.stderr, proc.stderr
    written = [p for p in theirs.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "report.md" for p in written), [p.name for p in written]
    for path in written:
        assert b"TOPSECRET" not in path.read_bytes(), path
    assert "TOPSECRET" not in proc.stdout + proc.stderr
    assert "not followed" in (theirs / "report.md").read_text() + proc.stdout, proc.stdout
