#!/usr/bin/env python3
"""Build the test image: Singularity.def's own recipe run on a Debian root file system (a sandbox image).

    .venv/bin/python tests/container/build_image.py      # prints the image's path; builds it if needed

Apptainer is in neither Debian 12 nor PyPI, so the recipe is run here the way `apptainer build` runs it,
with one difference: `From:` (a PyTorch CUDA runtime image) is replaced by a Debian 12 root file system
made with mmdebstrap, plus a venv at /opt/conda holding the CPU torch this checkout is tested with (what
the PyTorch image puts there). Then, as Apptainer does: %files copied, %post run (lines marked
`# not-in-test-image` skipped), %environment/%runscript/%test/%labels written to /.singularity.d/, and
%test run through the test `apptainer` (tests/container/apptainer). A failing line, a pin that does not
resolve or a failing %test fails the build.

Cached under /var/cache/hpctrain-test-image/ (HPCTRAIN_TEST_IMAGE_CACHE) by a hash of pyproject.toml,
Singularity.def, the files %files copies (the image holds a copy of the code) and IMAGE_RECIPE; the Debian
root file system alone by what it is made of (DEBIAN_RECIPE, the suite, the packages, torch). Both builds take a lock, so concurrent
callers build once. Needs root (mmdebstrap, bwrap, apt-get); installs mmdebstrap and bubblewrap if missing.
This is a test tool: nothing here is shipped.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[2]
DEF_FILE = ROOT / "Singularity.def"
STANDIN = Path(__file__).resolve().parent / "apptainer"
CACHE = Path(os.environ.get("HPCTRAIN_TEST_IMAGE_CACHE", "/var/cache/hpctrain-test-image"))
KEEP_S = 6 * 3600  # an older image than this is removed when another is built
SUITE = "bookworm"
# python3-dev: the PyTorch image's Python has its headers, which Inductor on CPU compiles against (Python.h)
DEBIAN_PACKAGES = "python3,python3-venv,python3-dev,ca-certificates"
DEBIAN_RECIPE = "v1"  # bump when build_debian() changes what it makes
IMAGE_RECIPE = "v1"  # bump when build_image() or write_metadata() changes what they make
SKIP_MARK = "# not-in-test-image"
# what `From: pytorch/pytorch:...` provides: PATH of the image's ENV (Apptainer writes it to 10-docker2singularity.sh)
BASE_PATH = "/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# pip configuration files a host may have: bound into the build so the local wheels and index are found
PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip", "/root/.pip", "/root/.config/pip")


def log(msg: str) -> None:
    print(f"build_image: {msg}", file=sys.stderr, flush=True)


def sections(text: str) -> Dict[str, str]:
    """The recipe's %sections, raw (spython strips indentation, which a heredoc's Python needs)."""
    out: Dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        head = line.strip()
        if line.startswith("%") and head[1:].isalpha():
            name = head[1:]
            out[name] = ""
        elif name is not None:
            out[name] += line
    return out


def files_lines() -> List[List[str]]:
    from spython.main.parse.parsers import SingularityParser  # a test dependency, as the recipe test's

    recipe = SingularityParser(str(DEF_FILE)).recipe["spython-base"]
    return [line.split() for line in recipe.files]


def tracked(paths: List[str]) -> List[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, check=True)
    return sorted(p for p in out.stdout.decode().split("\0") if p)


def base_torch() -> str:
    """The torch this checkout is tested with (the venv's), installed where the PyTorch image has its own."""
    import importlib.metadata

    return f"torch=={importlib.metadata.version('torch')}"


def digest(paths: List[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        content = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()  # git tracks a link as its text
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + content + b"\0")
    for e in extra:
        h.update(e.encode() + b"\0")
    return h.hexdigest()[:16]


def ensure_tools() -> None:
    if shutil.which("mmdebstrap") and shutil.which("bwrap"):
        return
    log("installing mmdebstrap and bubblewrap")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "mmdebstrap", "bubblewrap"]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def pip_binds() -> List[str]:
    """bwrap arguments that show the build the host's pip configuration and the local paths it names."""
    paths = [p for p in PIP_CONFIGS if os.path.exists(p)]
    conf = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings = [line.split("=", 1) for line in conf.splitlines() if "=" in line]
    settings += [[k, v] for k, v in os.environ.items() if k.startswith("PIP_")]
    for key, value in settings:
        for token in value.strip("'\"").split():
            token = token.removeprefix("file://").rstrip("/")
            if "index" in key.lower():  # a local index's pages link to files beside it: /opt/pypi/{simple,files}
                token = os.path.dirname(token)
            if token.startswith("/") and os.path.exists(token):
                paths.append(token)
    args: List[str] = []
    for p in dict.fromkeys(paths):
        args += ["--ro-bind", p, p]
    return args


def in_root(rootfs: Path, script: str, env: Dict[str, str], extra: Sequence[str] = ()) -> None:
    """Run a shell script as root inside the root file system (as `apptainer build` runs %post)."""
    cmd = ["bwrap", "--bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
           "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--cap-add", "ALL", *pip_binds(), *extra,
           "--clearenv", *[a for k, v in env.items() for a in ("--setenv", k, v)], "--chdir", "/",
           "/bin/sh", "-e", "-c", script]
    subprocess.run(cmd, check=True)


def build_debian(dest: Path) -> None:
    """Debian with python3, and a venv at /opt/conda holding torch: the stand-in for `From:`."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", f"--include={DEBIAN_PACKAGES}", SUITE, str(tmp)],
                   check=True)
    env = {"PATH": BASE_PATH, "HOME": "/root", "PIP_ROOT_USER_ACTION": "ignore", "PIP_NO_CACHE_DIR": "1",
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    in_root(tmp, f"python3 -m venv /opt/conda && /opt/conda/bin/python -m pip install -q '{base_torch()}'", env)
    tmp.rename(dest)
    log(f"Debian root file system with {base_torch()} built in {time.monotonic() - t0:.0f} s: {dest}")


def write_metadata(rootfs: Path, parts: Dict[str, str]) -> None:
    """What `apptainer build` writes to /.singularity.d/ from the recipe's sections."""
    meta = rootfs / ".singularity.d"
    (meta / "env").mkdir(parents=True, exist_ok=True)
    (meta / "env" / "10-docker2singularity.sh").write_text(f"#!/bin/sh\nexport PATH=\"{BASE_PATH}\"\n")
    (meta / "env" / "90-environment.sh").write_text("#!/bin/sh\n" + parts.get("environment", ""))
    for name, section in (("runscript", "runscript"), ("test", "test")):
        script = meta / name
        script.write_text("#!/bin/sh\n" + parts.get(section, ""))
        script.chmod(0o755)
    labels = dict(line.strip().split(None, 1) for line in parts.get("labels", "").splitlines() if line.strip())
    (meta / "labels.json").write_text(json.dumps(labels, indent=2) + "\n")
    (meta / "Singularity").write_text(DEF_FILE.read_text())


def build_image(debian: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    subprocess.run(["cp", "-a", "--reflink=auto", str(debian), str(tmp)], check=True)
    for src, dst in files_lines():  # %files: relative to the directory the build runs in (the project)
        target = tmp / dst.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(ROOT / src), str(target)], check=True)
    parts = sections(DEF_FILE.read_text())
    post = "".join(line for line in parts["post"].splitlines(keepends=True) if not line.rstrip().endswith(SKIP_MARK))
    env = {"PATH": BASE_PATH, "HOME": "/root", "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    log("running %post")
    in_root(tmp, post, env)
    write_metadata(tmp, parts)
    log("running %test")
    subprocess.run([str(STANDIN), "test", str(tmp)], check=True, cwd=str(ROOT))
    tmp.rename(dest)
    log(f"image built from Singularity.def in {time.monotonic() - t0:.0f} s: {dest}")


def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def debian_key() -> str:
    """What the Debian tree is made of (not this script's hash: an edit here need not rebuild it)."""
    return digest([], SUITE, DEBIAN_PACKAGES, base_torch(), BASE_PATH, DEBIAN_RECIPE)


def image_path() -> Path:
    """Where the image for this checkout lies (built or not)."""
    sources = [src for src, _ in files_lines()]
    inputs = [ROOT / "pyproject.toml", DEF_FILE] + [ROOT / p for p in tracked(sources)]
    return CACHE / f"image-{digest(inputs, debian_key(), IMAGE_RECIPE)}"


def ensure() -> Path:
    """The image's path, built first if the cache has none for this checkout."""
    image = image_path()
    if image.is_dir():
        return image
    with locked(CACHE / "build.lock"):
        if image.is_dir():
            return image
        ensure_tools()
        debian = CACHE / f"debian-{debian_key()}"
        if not debian.is_dir():
            build_debian(debian)
        build_image(debian, image)
        for old in CACHE.iterdir():  # the disk is not grown run by run; an image another checkout's tests
            # may still run (built within KEEP_S) is left alone: removing it took /usr/bin/env from under a job
            if old.is_dir() and old not in (image, debian) and time.time() - old.stat().st_mtime > KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
    return image


if __name__ == "__main__":
    try:
        print(ensure())
    except subprocess.CalledProcessError as exc:  # the step's own output is above; one line says which step
        step = "%post" if "/bin/sh" in exc.cmd else "%test" if "test" in exc.cmd[1:2] else exc.cmd[0]
        sys.exit(f"build_image: {step} failed (exit {exc.returncode}): the test image was not built")
