"""``python -m hpctrain status|report|cancel|tensorboard [SWEEP_DIR] ...``: arguments, then one module each.

Each command's module is imported only when that command runs (``report`` alone needs matplotlib).
"""

import argparse
import sys
from typing import List

from hpctrain.core.state import Direction
from hpctrain.review.sweep import SweepError, find_sweep_dir

_SWEEP_HELP = "the sweep dir (default: the newest sweep under ./multirun)"


def _port(text: str) -> int:
    """A TCP port, 1-65535: checked here, not found out as a traceback when the server binds."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port number from 1 to 65535")
    return int(text)


def _host(text: str) -> str:
    """An address of this machine to bind, that resolves (else the server would look for a free port in vain)."""
    import socket

    try:
        socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: does not resolve to an address to bind ({exc})") from None
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpctrain", description="Review a sweep without opening its logs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{status,report,cancel,tensorboard}")

    s = sub.add_parser("status", help="state and progress of every run")
    s.add_argument("sweep_dir", nargs="?", help=_SWEEP_HELP)
    s.add_argument("--watch", action="store_true", help="refresh until every run has ended")
    s.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between refreshes (10)")
    s.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")

    r = sub.add_parser("report", help="results table, best config, CSV/JSON/Markdown and plots")
    r.add_argument("sweep_dir", nargs="?", help=_SWEEP_HELP)
    r.add_argument("--metric", help="the metric to rank by (default: the sweep's objective, objective.metric; a search's own metric)")
    r.add_argument("--mode", choices=[d.value for d in Direction], help="lower or higher is better (default: the objective's mode for its metric, else from the name)")
    r.add_argument("--format", choices=["csv", "md", "json"], dest="form",
                   help="print results.csv, report.md or results.json on stdout (the rest goes to stderr)")

    c = sub.add_parser("cancel", help="cancel what is still queued or running")
    c.add_argument("sweep_dir", nargs="?", help=_SWEEP_HELP)
    c.add_argument("--run", type=int, action="append", metavar="INDEX", help="only this run (repeatable)")

    t = sub.add_parser("tensorboard", help="TensorBoard over the sweep, each run named by its swept values")
    t.add_argument("sweep_dir", nargs="?", help=_SWEEP_HELP)
    t.add_argument("--port", type=_port, help="port (default: 6006, or the next free one)")
    t.add_argument("--host", type=_host, default="127.0.0.1", help="address to bind (default 127.0.0.1: reach it by ssh tunnel)")
    t.add_argument("--no-token", action="store_true",
                   help="serve without the token (anyone who reaches the port can read the sweep)")
    return p


def run_subcommand(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        sweep_dir = find_sweep_dir(args.sweep_dir)
        if args.command == "status":
            from hpctrain.review import status

            return status.run(sweep_dir, watch=args.watch, interval_s=args.interval, as_json=args.json)
        if args.command == "report":
            from hpctrain.review import report

            return report.run(sweep_dir, metric=args.metric, mode=args.mode, form=args.form)
        if args.command == "cancel":
            from hpctrain.review import cancel

            return cancel.run(sweep_dir, runs=args.run)
        from hpctrain.review import tensorboard

        return tensorboard.run(sweep_dir, port=args.port, host=args.host, token=not args.no_token)
    except SweepError as exc:
        print(f"hpctrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main() -> None:
    sys.exit(run_subcommand(sys.argv[1:]))


if __name__ == "__main__":
    main()
