"""A command on a real terminal (a pty it has as its controlling terminal, in the foreground): ``send(b"\\x03")``
is a Ctrl-C, which the kernel's line discipline turns into SIGINT to the whole foreground process group."""

import fcntl
import os
import pty
import re
import signal
import struct
import termios
import threading
import time
from pathlib import Path
from typing import List, Optional

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class PtyProcess:
    def __init__(self, argv: List[str], cwd: Path, env: dict, columns: int = 120) -> None:
        pid, fd = pty.fork()  # the child: a new session, the pty its controlling terminal
        if pid == 0:
            try:
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        self.raw = bytearray()
        self.code: Optional[int] = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO once the child and everything holding the pty have gone
                return
            if not data:
                return
            self.raw += data

    def send(self, data: bytes) -> int:
        """Writes ``data`` as typed; the length of the output so far (to read what came after)."""
        mark = len(self.raw)
        os.write(self.fd, data)
        return mark

    def poll(self) -> Optional[int]:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self, timeout_s: float) -> Optional[int]:
        deadline = time.time() + timeout_s
        while self.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if self.code is not None:
            self._reader.join(timeout=5)
        return self.code

    def text(self, since: int = 0) -> str:
        return bytes(self.raw[since:]).decode("utf-8", "replace")

    def kill(self) -> None:
        if self.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)  # its own session and process group
            self.wait(10)


def screen_lines(text: str) -> List[str]:
    """The lines left below the last clear-to-end (``ESC[J``, what a redrawn block leaves), escapes and the
    echoed ``^C`` taken out, blank lines dropped."""
    tail = text.rsplit("\x1b[J", 1)[-1]
    plain = ANSI.sub("", tail).replace("^C", "").replace("\r", "")
    return [line for line in plain.split("\n") if line.strip()]
