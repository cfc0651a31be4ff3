"""The TensorBoard child of ``hpctrain tensorboard``: TensorBoard with the ``hpctrain`` tab, behind a token.

``python -m hpctrain.review.tensorboard_server --session-stdin TENSORBOARD_FLAGS...``: the session (token,
path prefix, the descriptor to report on) is read from the first line of stdin (a pipe from the parent),
never from argv or a file, so ``ps`` and other users of the machine do not see it. Once the server has
bound its port it writes ``bound`` on that descriptor: the parent prints the URL only then, so a user who
took the port first never receives it. TensorBoard's page opened without cards to pin (``/``) is redirected
to itself with the session's ``pinned`` cards (the objective and the losses), so they come first wherever
it is entered.
"""

import json
import os
import sys
from typing import Any, Dict, List
from urllib.parse import parse_qs

from tensorboard import default, program
from tensorboard.plugins import base_plugin

from hpctrain._compat import tensorboard as tb_compat
from hpctrain.review.tensorboard_plugin import HpctrainLoader
from hpctrain.review.token_gate import BOUND, SESSION_STDIN, TokenGate, allowed_hosts



def plugins() -> List[Any]:
    """TensorBoard's own plugins and those of entry points, with ours once (the entry point may hold it)."""
    found = default.get_plugins()
    if not any(p is HpctrainLoader or isinstance(p, HpctrainLoader) for p in found):
        found.append(HpctrainLoader())
    return found


def pinned_index(app: Any, prefix: str, pinned: str) -> Any:
    """TensorBoard's page opened without cards to pin (``/``, a bookmark without the printed URL's query) is
    redirected to itself with ``pinned`` (``pinnedCards=...``): the losses come first wherever it is entered.
    The fragment (``#timeseries``) stays with the browser across the redirect."""
    index = {prefix + "/", prefix or "/"}

    def wsgi(environ: Dict[str, Any], start_response: Any) -> Any:
        query = str(environ.get("QUERY_STRING") or "")
        if not pinned or environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") not in index \
                or "pinnedCards" in parse_qs(query):
            return app(environ, start_response)
        kept = "&".join(part for part in query.split("&") if part and not part.startswith("token="))
        location = f"{prefix}/?{pinned}" + (f"&{kept}" if kept else "")
        start_response("302 Found", [("Location", location), ("Content-Length", "0")])
        return [b""]

    return wsgi


def server_class(session: Dict[str, Any]) -> Any:
    token, prefix, bound_fd = str(session.get("token") or ""), str(session.get("prefix") or ""), session.get("bound_fd")
    pinned = str(session.get("pinned") or "")

    class GatedServer(program.WerkzeugServer):
        def __init__(self, wsgi_app: Any, flags: Any) -> None:
            hosts = allowed_hosts(flags.host or "", flags.port, session.get("hosts") or ())
            super().__init__(TokenGate(pinned_index(wsgi_app, prefix, pinned), token, flags.port, prefix, hosts), flags)
            if isinstance(bound_fd, int):  # bound and listening: our server, not someone else's, has the port
                os.write(bound_fd, BOUND)
                os.close(bound_fd)

        def print_serving_message(self) -> None:
            pass  # the parent prints the URL, with its token

    return GatedServer


def main(argv: List[str]) -> int:
    session: Dict[str, Any] = {}
    if SESSION_STDIN in argv:
        argv = [a for a in argv if a != SESSION_STDIN]
        try:
            session = json.loads(sys.stdin.readline())
        except ValueError:
            session = {}
        if not isinstance(session, dict) or "token" not in session:
            print("hpctrain tensorboard: error: no session on stdin", file=sys.stderr)
            return 2
        if session.get("prefix"):
            argv = [*argv, "--path_prefix", str(session["prefix"])]  # here, not in the argv `ps` shows
    tb_compat.global_init()
    board = program.TensorBoard(plugins=plugins(), server_class=server_class(session))
    try:
        board.configure(argv=[sys.argv[0], *argv])
    except base_plugin.FlagsError as exc:
        print(f"hpctrain tensorboard: error: {exc}", file=sys.stderr)
        return 2
    return board.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
