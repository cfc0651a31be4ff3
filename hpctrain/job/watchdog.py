"""The hang watchdog: a process of its own per node and run, reading the ranks' heartbeats (:mod:`heartbeat`).

Started by the job wrapper on each node's local rank 0 (``python -m hpctrain.job.watchdog SETTINGS``; by the app
itself when run directly: :mod:`hpctrain.job.direct`), it
polls the heartbeat files of its run's ranks on this node with its own clock; the training processes do
nothing for it but store their step. A rank whose step and phase have not changed for its allowance is
hung; the allowance is the largest of the phases it went through since its last step:

    phase                          allowance (knob, default)
    setup                          hang_setup_s; unset: hang_first_step_s: joining the process group, building
                                   the model and data, loading the checkpoint (nothing there marks progress)
    first steps                    hang_first_step_s (1800 s): a compile, warm-up
    train                          hang_timeout_s; unset: max(HANG_FLOOR_S, HANG_FACTOR x the longest wait
                                   between steps this watchdog saw after warm-up); 0: no watchdog at all
    eval                           hang_eval_s (1800 s)
    checkpoint                     hang_checkpoint_s (900 s)

A hang: every rank of the node is asked for its Python stack (faulthandler on the dump signal; py-spy's
native frames too where it is installed), the stacks are copied into ``<run_dir>/stacks/``, the attempt is
recorded ``hung`` through the run's lifecycle (the decision table: retried within max_retries) naming the
ranks, the node and the top frame, and the node's ranks are killed: the step ends, and the code that
decides retries after it (``attempt_ended``, the local launcher, the packed task, the search worker)
retries it from its last checkpoint; on Slurm away from the node (``attempt_ended``). No torch here.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from hpctrain.core import paths as runfiles
from hpctrain.core import safefs, stopping
from hpctrain.core.atomic import write_text_atomic
from hpctrain.job import hangcall, heartbeat
from hpctrain.job.heartbeat import Beat, Phase

HANG_FLOOR_S = 300.0  # the derived train allowance is never shorter
HANG_FACTOR = 10.0  # x the longest wait between steps seen after warm-up
WARMUP_STEPS = 3  # steps after the first still under the first step's allowance (a compile's recompiles)
DUMP_WAIT_S = 3.0  # for the ranks' faulthandler dumps to land


@dataclass(frozen=True)
class WatchSettings:
    directory: str  # the attempt's heartbeat dir
    run_dir: str
    parent: int  # the wrapper's pid (local rank 0): the watchdog ends with it
    timeout_s: Optional[float] = None  # the train allowance; None: derived; 0: off
    first_step_s: float = 1800.0
    eval_s: float = 1800.0
    checkpoint_s: float = 900.0
    job_id: str = ""
    node: str = ""
    # 0: the hung ranks are killed at once (their process is the attempt's); else first interrupted (a search
    # worker's trial: HangInterrupt ends the trial, the worker lives on), killed if not out of training by then
    interrupt_s: float = 0.0
    setup_s: Optional[float] = None  # None: first_step_s
    nodes: int = 1  # the step's nodes: more than one, the nodes' watchdogs agree on one decision (hangcall)
    attempt: str = ""  # the job and restart count, the same on every node: the hang dir's name

    @property
    def setup_allowance(self) -> float:
        return self.first_step_s if self.setup_s is None else self.setup_s

    @property
    def poll_s(self) -> float:
        return min(1.0, max(0.05, (self.timeout_s or 5.0) / 5))

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def settings_of(config: Any, directory: Path, run_dir: Path, job_id: str,
                interrupt_s: float = 0.0, nodes: int = 1) -> Optional[WatchSettings]:
    """The watchdog's settings from a run's composed config (keys absent in a user's own app: defaults);
    None when ``hang_timeout_s=0`` turns it off."""
    def get(key: str, default: Any) -> Any:
        value = config.get(key, default) if hasattr(config, "get") else default
        return default if value is None else value

    timeout = config.get("hang_timeout_s") if hasattr(config, "get") else None
    if timeout is not None and float(timeout) == 0:
        return None
    node = heartbeat.node_name()
    attempt = Path(directory).name.split("-", 1)[-1].removesuffix(f"-{node}")  # the heartbeat dir's, less the node
    setup = config.get("hang_setup_s") if hasattr(config, "get") else None
    return WatchSettings(str(directory), str(run_dir), os.getpid(), None if timeout is None else float(timeout),
                         float(get("hang_first_step_s", 1800.0)), float(get("hang_eval_s", 1800.0)),
                         float(get("hang_checkpoint_s", 900.0)), job_id, node, interrupt_s,
                         setup_s=None if setup is None else float(setup), nodes=max(1, int(nodes)), attempt=attempt)


def start(settings: WatchSettings) -> "subprocess.Popen[bytes]":
    """The watchdog process for this node's ranks of the run (its own session: a signal to the step's
    process group, a Ctrl-C, does not reach it before it is done). Called before the node's ranks start: the
    dir's marker tells each rank that it is watched (:meth:`heartbeat.Heart.check_watched`)."""
    try:
        heartbeat.mark_watched(Path(settings.directory))
    except OSError as exc:  # the ranks refuse the same dir and say so; one without the marker stops (UnwatchedError)
        print(f"hpctrain: the hang watchdog's dir cannot be used: {exc}", file=sys.stderr, flush=True)
    return subprocess.Popen([sys.executable, "-m", "hpctrain.job.watchdog", settings.to_json()],
                            stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: "Optional[subprocess.Popen[bytes]]") -> None:
    stopping.end_child(proc, grace_s=5)


# ---------------------------------------------------------------- watching
@dataclass
class Watch:
    """One rank as the watchdog saw it."""

    path: Path  # its heartbeat file
    beat: Beat
    changed_at: float
    phases: Set[Phase] = field(default_factory=set)  # gone through since its last step
    origin: Optional[int] = None  # its step when it was first seen training (a resumed run's checkpoint step)

    @property
    def advances(self) -> int:
        """Steps trained since this watchdog first saw it training (warm-up counts from there)."""
        return 0 if self.origin is None else self.beat.step - self.origin


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


class Watchdog:
    def __init__(self, settings: WatchSettings) -> None:
        self.s = settings
        self.watches: Dict[Path, Watch] = {}
        self.longest_gap = 0.0  # the longest wait between two steps seen after warm-up, any rank
        self.stack_paths: Dict[int, Path] = {}  # each rank's stack file written into the run dir

    def train_allowance(self) -> float:
        if self.s.timeout_s:
            return self.s.timeout_s
        return max(HANG_FLOOR_S, HANG_FACTOR * self.longest_gap)

    def allowance(self, w: Watch) -> float:
        out = 0.0
        for phase in w.phases:
            if phase is Phase.SETUP:
                out = max(out, self.s.setup_allowance)
            elif phase is Phase.TRAIN and w.advances <= WARMUP_STEPS:
                out = max(out, self.s.first_step_s)
            elif phase is Phase.TRAIN:
                out = max(out, self.train_allowance())
            elif phase is Phase.EVAL:
                out = max(out, self.s.eval_s)
            elif phase is Phase.CHECKPOINT:
                out = max(out, self.s.checkpoint_s)
            else:
                out = float("inf")
        return out

    def look(self, now: float) -> List[Watch]:
        """Read every heartbeat; the ranks past their allowance."""
        for path in heartbeat.beats(Path(self.s.directory)):
            beat = heartbeat.read(path)
            if beat is None:
                continue
            w = self.watches.get(path)
            if w is None:
                w = self.watches[path] = Watch(path, beat, now, {beat.phase})
            if w.origin is None and beat.phase is Phase.TRAIN:
                w.origin = beat.start  # however late this watchdog first looked
            if beat.step != w.beat.step:
                gap = now - w.changed_at
                w.beat = beat
                if w.advances > WARMUP_STEPS and w.phases == {Phase.TRAIN} and beat.phase is Phase.TRAIN:
                    self.longest_gap = max(self.longest_gap, gap)
                w.beat, w.changed_at, w.phases = beat, now, {beat.phase}
            elif beat.phase is not w.beat.phase:
                w.beat, w.changed_at = beat, now
                w.phases.add(beat.phase)
        for path in [p for p, w in self.watches.items() if not alive(w.beat.pid)]:
            del self.watches[path]  # a rank that died is not hung: its step fails on its own
        return [w for w in self.watches.values() if w.beat.phase is not Phase.DONE
                and now - w.changed_at > self.allowance(w)]

    def run(self) -> int:
        exchange = hangcall.Exchange(self.s.run_dir, self.s.attempt, self.s.node, self.s.nodes) \
            if self.s.nodes > 1 else None
        while alive(self.s.parent):
            now = time.monotonic()
            stalled = self.look(now)
            if stalled or (exchange is not None and exchange.called()):
                self.hang(stalled, now, exchange)
                return 1
            time.sleep(self.s.poll_s)
        return 0

    # ---------------------------------------------------------------- a hang
    def hang(self, stalled: List[Watch], now: float, exchange: "Optional[hangcall.Exchange]" = None) -> None:
        """Dump this node's ranks, decide (alone, or as the caller of a run over several nodes: :mod:`hangcall`)
        and end this node's ranks."""
        caller = exchange is None or exchange.call()
        ranks = sorted(self.watches.values(), key=lambda w: w.beat.rank)
        mine = self.report(ranks, stalled, now)
        if exchange is None:
            self.record(mine)
        elif caller:
            exchange.report(mine)
            everyone = exchange.gather(lambda: alive(self.s.parent))
            exchange.decided(self.record(everyone or mine, exchange))
        else:  # called on another node: its watchdog decides from every node's report, this one's too
            exchange.report(mine)
            print(f"hpctrain: a hang called by the watchdog on {exchange.caller() or 'another node'}: the stacks "
                  f"of {len(ranks)} rank(s) on {self.s.node} dumped", file=sys.stderr, flush=True)
            exchange.wait_decided(lambda: alive(self.s.parent))
        if self.s.interrupt_s:
            self.interrupt(ranks)
        for w in ranks:  # the step is torn down: a hung process may ignore anything but SIGKILL
            if alive(w.beat.pid) and self.still_training(w):
                try:
                    os.kill(w.beat.pid, signal.SIGKILL)
                except OSError:
                    pass

    def report(self, ranks: List[Watch], stalled: List[Watch], now: float) -> List[hangcall.RankReport]:
        """This node's ranks as the hang found them, their stacks dumped into the run dir."""
        stacks = self.dump(ranks)
        late = {w.path for w in stalled}
        out = []
        for w in ranks:
            frames = main_frames(stacks.get(w.beat.rank, ""), w.beat.thread)
            frame = top_frame(frames)
            where = f"{frame[1]} ({Path(frame[0]).name}:{frame[2]})" if frame else ""
            # waits in its own code, not in torch (a collective, the backward of a peer's step)
            own = bool(frames) and not in_torch(frames[0][0])
            out.append(hangcall.RankReport(w.beat.rank, self.s.node, w.beat.step, w.beat.phase.name.lower(),
                                           w.path in late, own, where, now - w.changed_at, self.allowance(w),
                                           str(self.stack_paths.get(w.beat.rank, ""))))
        return out

    def record(self, ranks: List[hangcall.RankReport], exchange: "Optional[hangcall.Exchange]" = None) -> str:
        """The one ``hung`` record of the attempt, naming the ranks and nodes it is blamed on; its line."""
        blamed, fallout = hangcall.named(ranks)
        first = blamed[0]
        late = sorted((r for r in ranks if r.stalled), key=lambda r: -r.quiet_s)
        timed = first if first.stalled or not late else late[0]
        nodes = list(dict.fromkeys(r.node for r in blamed))
        where = first.frame or "an unknown frame (no stack dump)"
        who = ",".join(str(r.rank) for r in blamed)
        at = "in setup, before training" if first.phase == Phase.SETUP.name.lower() else \
            f"at step {max(first.step, 0)} ({first.phase})"
        line = (f"hung {at}: no progress for "
                f"{max([r.quiet_s for r in late] or [first.quiet_s]):.0f} s (allowance {timed.allowance_s:.0f} s); "
                f"rank{'s' if len(blamed) > 1 else ''} {who} on {','.join(nodes)} in {where}; "
                f"stacks in {runfiles.STACKS_DIR}/")
        stacks_dir = Path(self.s.run_dir).absolute() / runfiles.STACKS_DIR  # said in full: a user may be anywhere
        print(f"hpctrain: {line[:-len(runfiles.STACKS_DIR) - 1]}{stacks_dir}/", file=sys.stderr, flush=True)
        from hpctrain.job.lifecycle import Lifecycle, Outcome

        shared = {} if exchange is None else {
            "called_by": self.s.node, "nodes_reported": sorted({r.node for r in ranks}), "nodes_expected": exchange.nodes}
        try:
            Lifecycle(Path(self.s.run_dir), rank=first.rank, job_id=self.s.job_id or None).end(
                Outcome.HUNG, error=line,
                event={"ranks": [r.rank for r in blamed], "nodes": nodes, "step": first.step, "phase": first.phase,
                       "frame": where, "fallout": fallout, "stacks": sorted(r.stack for r in ranks if r.stack),
                       **shared})
        except OSError as exc:
            print(f"hpctrain: the hang cannot be recorded: {exc}", file=sys.stderr, flush=True)
        return line

    def interrupt(self, ranks: List[Watch]) -> None:
        """HangInterrupt in each rank's main thread; wait until each is out of training (its heartbeat done)
        or gone, at most ``interrupt_s``. A rank stuck in a C call never sees it: killed after that."""
        for w in ranks:
            try:
                os.kill(w.beat.pid, heartbeat.INTERRUPT_SIGNAL)
            except OSError:
                pass
        deadline = time.monotonic() + self.s.interrupt_s
        while time.monotonic() < deadline and any(alive(w.beat.pid) and self.still_training(w) for w in ranks):
            time.sleep(0.1)

    @staticmethod
    def still_training(w: Watch) -> bool:
        beat = heartbeat.read(w.path)
        return beat is None or beat.phase is not Phase.DONE

    def dump(self, ranks: List[Watch]) -> Dict[int, str]:
        """Every rank's stack (faulthandler, and py-spy where installed), copied into the run dir."""
        sizes: Dict[int, int] = {}
        for w in ranks:
            stack = self.stack_file(w)
            sizes[w.beat.rank] = stack.stat().st_size if stack.exists() else 0
            try:
                os.kill(w.beat.pid, heartbeat.DUMP_SIGNAL)
            except OSError:
                pass
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline:
            if all(self.stack_file(w).exists() and self.stack_file(w).stat().st_size > sizes[w.beat.rank]
                   for w in ranks):
                time.sleep(0.2)  # the rest of the dump (all threads)
                break
            time.sleep(0.05)
        out: Dict[int, str] = {}
        target = Path(self.s.run_dir) / runfiles.STACKS_DIR
        tag = Path(self.s.directory).name.split("-", 1)[-1]  # the job and restart count
        for w in ranks:
            try:
                text = self.stack_file(w).read_text(errors="replace")[sizes[w.beat.rank]:]
            except OSError:
                text = ""
            out[w.beat.rank] = text
            native = py_spy(w.beat.pid)
            body = (f"# rank {w.beat.rank} (pid {w.beat.pid}) on {self.s.node}, step {w.beat.step}, phase "
                    f"{w.beat.phase.name.lower()}: Python stacks (faulthandler, most recent call first)\n{text}"
                    + (f"\n# py-spy dump --native\n{native}" if native else ""))
            try:
                safefs.own_dir(target)  # a run dir in a group project space: no planted link followed
                path = target / f"{tag}-rank{w.beat.rank}.txt"
                write_text_atomic(path, body)
                self.stack_paths[w.beat.rank] = path
            except OSError as exc:
                print(f"hpctrain: cannot write the stack of rank {w.beat.rank}: {exc}", file=sys.stderr, flush=True)
        return out

    @staticmethod
    def stack_file(w: Watch) -> Path:
        return w.path.with_suffix(".stack")  # the rank's faulthandler file, beside its heartbeat


def py_spy(pid: int) -> str:
    """py-spy's dump with native frames, where it is installed (it needs ptrace rights)."""
    exe = shutil.which("py-spy")
    if exe is None:
        return ""
    try:
        done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy failed: {exc})"
    return done.stdout or done.stderr


_HEADER = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)', re.M)


Frame = Tuple[str, str, int]  # file, function, line


def main_frames(dump: str, thread: int) -> List[Frame]:
    """The main thread's frames in a faulthandler dump, innermost first."""
    blocks = _HEADER.split(dump)
    for i in range(1, len(blocks) - 1, 2):
        if int(blocks[i], 16) == thread:
            return [(f, fn, int(ln)) for f, ln, fn in _FRAME.findall(blocks[i + 1])]
    return []


def top_frame(frames: List[Frame]) -> Optional[Frame]:
    """The innermost frame outside the standard library and torch (where the run's own code waits), else
    the innermost; None without frames."""
    own = [f for f in frames if not in_stdlib(f[0]) and not in_torch(f[0])]
    return (own or frames)[0] if frames else None


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


_TORCH = _package_dir("torch")
_STDLIB = os.path.dirname(os.__file__)


def in_torch(path: str) -> bool:
    return bool(_TORCH) and path.startswith(str(_TORCH) + os.sep)


def in_stdlib(path: str) -> bool:
    return path.startswith(_STDLIB + os.sep) and "site-packages" not in path


def main(argv: List[str]) -> int:
    settings = WatchSettings(**json.loads(argv[0]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the wrapper's stop at the run's end
    try:
        return Watchdog(settings).run()
    finally:
        shutil.rmtree(settings.directory, ignore_errors=True)  # the attempt's heartbeats: memory, not disk


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
