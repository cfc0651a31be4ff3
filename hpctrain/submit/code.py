"""The code a submission runs: its snapshot planned once per process, the job-script lines that import it
first, the copy taken before the first send, and the record of what ran (:mod:`provenance`)."""

import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

from hydra.types import HydraContext

from hpctrain.submit import provenance, snapshot
from hpctrain.submit.errors import LaunchError
from hpctrain.submit.submission import Calling, Files, Submission


class CodeStage:
    """``hydra.launcher.snapshot`` applied: planned in the checks, taken once, said on stderr."""

    def __init__(self, options: Any, container: Any) -> None:
        self.options = options  # hydra.launcher.snapshot
        self.container = container  # hydra.launcher.container
        self.copy: Optional[snapshot.CodeCopy] = None  # planned by plan(); None: no snapshot
        self.app: Optional[Path] = None  # the app's own directory (snapshot.app_dir); None: hpctrain's app

    def plan(self, sweep_dir: Path) -> List[str]:
        """What the snapshot would copy, and its problems; planned once per process (one per sweep)."""
        options, problems = snapshot.read_options(self.options)
        if options is not None and self.copy is None:
            self.copy = snapshot.plan(options, cwd(), Files.next_in(sweep_dir).code_dir, exclude=[sweep_dir],
                                      app=self.app)
        return problems + (self.copy.problems if self.copy else [])

    def place(self, files: Files) -> None:
        """Copy into ``files``' code dir, unless the copy is already taken (one copy per process)."""
        if self.copy is not None and not self.copy.taken:
            self.copy.code_dir = files.code_dir

    def lines(self) -> List[str]:
        """The job script's lines that make its Python import the snapshot first."""
        if self.copy is None:
            return []
        c = self.container
        return snapshot.setup_lines(self.copy.python_path(cwd()), c.runtime if c.image else None)

    def say(self, dry_run: bool = False, seconds: float = 0.0) -> None:
        """On stderr, as notes: stdout keeps the dry run's script and run list as they were."""
        if self.copy is None:
            print("hpctrain: no code snapshot (hydra.launcher.snapshot=false): tasks import the live tree",
                  file=sys.stderr)
            return
        for note in self.copy.notes:
            print(f"hpctrain: {note}", file=sys.stderr)
        size = sum(self.copy.files.values()) / 2**20
        done = "would copy" if dry_run else f"copied in {seconds:.2f} s"
        print(f"hpctrain: code snapshot: {len(self.copy.files)} files, {size:.1f} MB, {done} to {self.copy.code_dir}",
              file=sys.stderr)

    def take(self, submission: Submission, hydra_context: HydraContext) -> Tuple[HydraContext, Path]:
        """Copy the code (once per process) and record what runs: the Hydra context the job composes with,
        and the record's path."""
        if self.copy is not None and not self.copy.taken:
            try:
                self.say(seconds=self.copy.take())
            except OSError as exc:
                raise LaunchError(f"nothing submitted: cannot write the code snapshot {self.copy.code_dir}: {exc}")
        elif self.copy is None:
            self.say()
        repos = self.copy.repos if self.copy else snapshot.source_repos(cwd(), self.app)
        runs = [r.idx for r in submission.runs] if submission.calling != Calling.POSITIONAL else []
        record_path = provenance.write(
            submission.files.base, submission.sweep_dir, runs=runs, repos=repos,
            code_dir=self.copy.code_dir if self.copy else None, app_dir=self.copy.app_dir if self.copy else self.app,
            python_path=self.copy.python_path(cwd()) if self.copy else None, job_python=submission.python,
            image=self.container.image)
        context = snapshot.relocate_search_path(hydra_context, self.copy) if self.copy else hydra_context
        return context, record_path


def cwd() -> Path:
    return Path(os.path.realpath(os.getcwd()))
