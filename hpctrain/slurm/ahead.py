"""The cluster's answers a launch will need, asked at its start, in the background, while the plan is made.

A submission asks scontrol (partitions, nodes, limits) and sacctmgr (the queue cap: slurmdbd answers in a
few tenths of a second) questions whose answers do not depend on the plan; asked one after the other after
the plan, they were about a fifth of a 1,000-point command's wall time. :class:`Ahead` starts each
question in a thread of its own when asked (:meth:`Ahead.ask`), and hands its answer, or its exception,
to the first caller that takes it (:meth:`Ahead.take`); a question not asked ahead (or taken already) is
asked then, as before. Daemon threads: a command that ends early (a refused setting) never waits on them.
"""

import threading
from typing import Any, Callable, Dict, Optional, Tuple


class _Pending:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Tuple[Optional[BaseException], Any] = (None, None)
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = (None, fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller that takes it, raised there
            self.result = (exc, None)


class Ahead:
    """Questions asked now, answered to their first taker."""

    def __init__(self) -> None:
        self._asked: Dict[str, _Pending] = {}

    def ask(self, name: str, fn: Callable[[], Any]) -> None:
        """Start ``fn()`` in the background under ``name`` (once: a name asked already is left as it is)."""
        if name not in self._asked:
            self._asked[name] = _Pending(fn)

    def take(self, name: str, fn: Callable[[], Any]) -> Any:
        """The answer asked under ``name`` (waited for), raised where it raised; ``fn()`` now where none is."""
        pending = self._asked.pop(name, None)
        if pending is None:
            return fn()
        pending.thread.join()
        exc, value = pending.result
        if exc is not None:
            raise exc
        return value
