"""The ``hpctrain`` tab: a TensorBoard plugin with two routes, its page (``/index.js``, plain JavaScript
shown in an iframe, no build step) and the sweep as JSON (``/data``), re-read on each call."""

import json
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from hpctrain.review.tensorboard_plugin.data import TailCache, payload

PLUGIN_NAME = "hpctrain"
SWEEP_FLAG = "hpctrain_sweep_dir"


class HpctrainPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext, sweep_dir: Optional[Path] = None) -> None:
        if sweep_dir is None:
            sweep_dir = getattr(context.flags, SWEEP_FLAG, None) if context.flags else None
        self.sweep_dir = Path(sweep_dir) if sweep_dir else None
        self._tails = TailCache()

    def get_plugin_apps(self) -> Dict[str, Callable[..., Any]]:
        return {"/index.js": self._serve_js, "/data": self._serve_data}

    def is_active(self) -> bool:
        return self.sweep_dir is not None

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="hpctrain")

    @wrappers.Request.application
    def _serve_js(self, request: wrappers.Request) -> wrappers.Response:
        js = resources.files(__package__).joinpath("static", "index.js").read_text(encoding="utf-8")
        return http_util.Respond(request, js, "application/javascript")

    @wrappers.Request.application
    def _serve_data(self, request: wrappers.Request) -> wrappers.Response:
        if self.sweep_dir is None:
            body: Dict[str, Any] = {"problems": [f"no sweep: start TensorBoard with `hpctrain tensorboard SWEEP_DIR` "
                                                 f"(or --{SWEEP_FLAG})"], "runs": []}
        else:
            body = payload(self.sweep_dir, self._tails)
        return http_util.Respond(request, json.dumps(body, default=str), "application/json")


class HpctrainLoader(base_plugin.TBLoader):
    """Adds ``--hpctrain_sweep_dir`` to TensorBoard's flags; the entry point ``tensorboard_plugins`` names it."""

    def define_flags(self, parser: Any) -> None:
        parser.add_argument(f"--{SWEEP_FLAG}", metavar="PATH", default=None,
                            help="the hpctrain sweep dir the hpctrain tab shows")

    def load(self, context: base_plugin.TBContext) -> HpctrainPlugin:
        return HpctrainPlugin(context)
