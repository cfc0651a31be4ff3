"""The TensorBoard child of ``hpctrain tensorboard``: TensorBoard with the ``hpctrain`` tab, behind a token.

``python -m hpctrain.review.tensorboard_server [--token-stdin] TENSORBOARD_FLAGS...``: the token is read
from the first line of stdin (a pipe from the parent), never from argv or a file, so ``ps`` and other
users of the machine do not see it.
"""

import sys
from typing import Any, List

from tensorboard import default, program
from tensorboard.plugins import base_plugin

from hpctrain._compat import tensorboard as tb_compat
from hpctrain.review.tensorboard_plugin import HpctrainLoader
from hpctrain.review.token_gate import TokenGate

TOKEN_STDIN = "--token-stdin"


def plugins() -> List[Any]:
    """TensorBoard's own plugins and those of entry points, with ours once (the entry point may hold it)."""
    found = default.get_plugins()
    if not any(p is HpctrainLoader or isinstance(p, HpctrainLoader) for p in found):
        found.append(HpctrainLoader())
    return found


def server_class(token: str) -> Any:
    class GatedServer(program.WerkzeugServer):
        def __init__(self, wsgi_app: Any, flags: Any) -> None:
            super().__init__(TokenGate(wsgi_app, token, flags.port) if token else wsgi_app, flags)

        def print_serving_message(self) -> None:
            pass  # the parent prints the URL, with its token

    return GatedServer


def main(argv: List[str]) -> int:
    token = ""
    if TOKEN_STDIN in argv:
        argv = [a for a in argv if a != TOKEN_STDIN]
        token = sys.stdin.readline().strip()
        if not token:
            print("hpctrain tensorboard: error: no token on stdin", file=sys.stderr)
            return 2
    tb_compat.global_init()
    board = program.TensorBoard(plugins=plugins(), server_class=server_class(token))
    try:
        board.configure(argv=[sys.argv[0], *argv])
    except base_plugin.FlagsError as exc:
        print(f"hpctrain tensorboard: error: {exc}", file=sys.stderr)
        return 2
    return board.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
