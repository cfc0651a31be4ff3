"""The ``hpctrain`` tab: a TensorBoard plugin with two routes, its page (``/index.js``, plain JavaScript
shown in an iframe, no build step) and the sweep as JSON (``/data``).

``/data`` answers at once with the newest read of the sweep and, when that read is older than
``FRESH_S``, starts the next one in a thread: a 10,000-run sweep takes about a second to read, which the
page (polling every 2 s) never waits for, and nothing is read while nobody looks. A change on disk shows
within one poll plus one read.
"""

import json
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from hpctrain.review.tensorboard_plugin.data import TailCache, payload

PLUGIN_NAME = "hpctrain"
SWEEP_FLAG = "hpctrain_sweep_dir"
FRESH_S = 1.0  # a read younger than this is served as it is
STALE_S = 30.0  # a read this old is not shown: the request waits for the next one
FIRST_READ_S = 120.0  # the longest a request waits for a read


class LatestRead:
    """The newest JSON of a sweep; one read at a time, in a thread."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self._tails = TailCache()
        self._lock = threading.Lock()
        self._body: Optional[str] = None
        self._read_at = 0.0  # when the newest read began
        self._reading: Optional[threading.Thread] = None
        self.logs: Dict[int, str] = {}  # each run's log, as the newest read found it: the only files /log serves

    def tail(self, idx: int) -> List[str]:
        return self._tails.tail(self.logs.get(idx))

    def start(self) -> None:
        """A read now, unless one is under way."""
        with self._lock:
            if self._reading is None:
                self._reading = threading.Thread(target=self._read, name="hpctrain-tab-read", daemon=True)
                self._reading.start()

    def _read(self) -> None:
        began = time.monotonic()
        try:
            data = payload(self.sweep_dir, self._tails)
            self.logs = {int(r["idx"]): r["log"] for r in data.get("runs", []) if r.get("log")}
            body = json.dumps(data, default=str)
        except Exception as exc:  # noqa: BLE001 - the page says what went wrong; the server stays up
            body = json.dumps({"problems": [f"{self.sweep_dir}: could not be read: {exc!r}"], "runs": []})
        with self._lock:
            self._body, self._read_at, self._reading = body, began, None

    def body(self) -> str:
        """The newest read, at once while the page polls; the next read is started if this one is stale.
        Before the first read, or when the newest is older than STALE_S (nobody looked for a while), the
        next one is waited for."""
        age = time.monotonic() - self._read_at
        if age > FRESH_S:
            self.start()
        with self._lock:
            reading = self._reading
        if reading is not None and (self._body is None or age > STALE_S):
            reading.join(FIRST_READ_S)
        with self._lock:
            return self._body or json.dumps({"problems": ["the sweep is still being read"], "runs": []})


class HpctrainPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext, sweep_dir: Optional[Path] = None) -> None:
        if sweep_dir is None:
            sweep_dir = getattr(context.flags, SWEEP_FLAG, None) if context.flags else None
        self.sweep_dir = Path(sweep_dir) if sweep_dir else None
        self._latest = LatestRead(self.sweep_dir) if self.sweep_dir is not None else None
        if self._latest is not None:
            self._latest.start()  # read while TensorBoard starts: the first page finds it ready

    def get_plugin_apps(self) -> Dict[str, Callable[..., Any]]:
        return {"/index.js": self._serve_js, "/data": self._serve_data, "/log": self._serve_log}

    def is_active(self) -> bool:
        return self.sweep_dir is not None

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="hpctrain")

    @wrappers.Request.application  # type: ignore[arg-type]  # werkzeug types it for plain functions; a method works
    def _serve_js(self, request: wrappers.Request) -> wrappers.Response:
        js = resources.files(__package__).joinpath("static", "index.js").read_text(encoding="utf-8")
        return http_util.Respond(request, js, "application/javascript")

    @wrappers.Request.application  # type: ignore[arg-type]  # werkzeug types it for plain functions; a method works
    def _serve_data(self, request: wrappers.Request) -> wrappers.Response:
        if self._latest is None:
            body: Dict[str, Any] = {"problems": [f"no sweep: start TensorBoard with `hpctrain tensorboard SWEEP_DIR` "
                                                 f"(or --{SWEEP_FLAG})"], "runs": []}
            return http_util.Respond(request, json.dumps(body), "application/json")
        return http_util.Respond(request, self._latest.body(), "application/json")


    @wrappers.Request.application  # type: ignore[arg-type]  # werkzeug types it for plain functions; a method works
    def _serve_log(self, request: wrappers.Request) -> wrappers.Response:
        """The tail of one run's log (``?idx=N``), a run of this sweep only."""
        try:
            idx = int(request.args.get("idx", ""))
        except ValueError:
            return http_util.Respond(request, "idx: expected a run's number", "text/plain", code=400)
        lines = self._latest.tail(idx) if self._latest is not None else []
        return http_util.Respond(request, "\n".join(lines) or f"run {idx}: no log yet", "text/plain")


class HpctrainLoader(base_plugin.TBLoader):
    """Adds ``--hpctrain_sweep_dir`` to TensorBoard's flags; the entry point ``tensorboard_plugins`` names it."""

    def define_flags(self, parser: Any) -> None:
        parser.add_argument(f"--{SWEEP_FLAG}", metavar="PATH", default=None,
                            help="the hpctrain sweep dir the hpctrain tab shows")

    def load(self, context: base_plugin.TBContext) -> HpctrainPlugin:
        return HpctrainPlugin(context)
