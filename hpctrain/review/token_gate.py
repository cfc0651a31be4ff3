"""A WSGI gate that lets in only who holds the token (as Jupyter does): ``?token=...`` on any request sets
an HttpOnly, SameSite=Strict cookie; afterwards the cookie suffices; anything else is 403.

On a shared login node every user reaches 127.0.0.1, and a browser sends a host's cookies to every port
of it: a colleague's TensorBoard on the next port would receive ours. So the session lives under a path
of its own (``/s/<random>/``, TensorBoard's ``--path_prefix``, never in an argv): the cookie's ``Path`` is
that prefix, so the browser sends it to no other server, and its value is derived from the token, the
port and the prefix, which no other server sees. A request whose Host is not this server's
(``127.0.0.1:PORT``, ``localhost:PORT``) is refused too: a page of another site that renamed itself to
127.0.0.1 (DNS rebinding) gets nothing.
"""

import hashlib
import hmac
from http.cookies import SimpleCookie
from typing import Any, Callable, Iterable, List, Sequence, Tuple
from urllib.parse import parse_qs

SESSION_STDIN = "--session-stdin"  # the child reads its session (token, prefix, descriptor) from stdin
BOUND = b"bound\n"  # what the child writes on that descriptor once its server holds the port
WSGIApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]
FORBIDDEN = (b"403 Forbidden: this TensorBoard is opened with its token. Open the URL `hpctrain tensorboard` "
             b"printed (it ends in ?token=...).\n")
WRONG_HOST = (b"403 Forbidden: this TensorBoard answers to 127.0.0.1:PORT or localhost:PORT only (the Host "
              b"header of this request names another server).\n")


def cookie_name(port: int) -> str:
    """Per port: cookies are shared by every port of a host, and several TensorBoards may run on one."""
    return f"hpctrain-tb-{port}"


def allowed_hosts(host: str, port: int, more: Sequence[str] = ()) -> List[str]:
    """The Host headers this server answers to: loopback by name and address, and ``host`` (``--host``)."""
    names = ["127.0.0.1", "localhost", "[::1]"] + [h for h in (host, *more) if h and h not in ("0.0.0.0", "::")]
    return list(dict.fromkeys(f"{n}:{port}".lower() for n in names))


def _refuse(start_response: Callable[..., Any], body: bytes) -> Iterable[bytes]:
    start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                     ("Content-Length", str(len(body)))])
    return [body]


class TokenGate:
    """``token`` "" (``--no-token``): the Host check alone."""

    def __init__(self, app: WSGIApp, token: str, port: int, prefix: str = "", hosts: Sequence[str] = ()) -> None:
        self.app = app
        self._token = token.encode()
        self._hosts = set(hosts) if hosts else set(allowed_hosts("", port))
        self._path = prefix or "/"
        # the cookie holds a value derived from the token, this port and the session's path, not the token
        self._cookie_value = hmac.new(self._token, f"hpctrain tensorboard cookie {port} {prefix}".encode(),
                                      hashlib.sha256).hexdigest()
        self._cookie = cookie_name(port)

    def _has_token(self, environ: dict) -> bool:
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token", [])
        return any(hmac.compare_digest(t.encode(), self._token) for t in given)

    def _has_cookie(self, environ: dict) -> bool:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # noqa: BLE001 - a malformed Cookie header is no cookie
            return False
        morsel = jar.get(self._cookie)
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), self._cookie_value.encode())

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("HTTP_HOST", "")).lower() not in self._hosts:
            return _refuse(start_response, WRONG_HOST)
        if not self._token or self._has_cookie(environ):
            return self.app(environ, start_response)
        if not self._has_token(environ):
            return _refuse(start_response, FORBIDDEN)
        set_cookie = f"{self._cookie}={self._cookie_value}; Path={self._path}; HttpOnly; SameSite=Strict"

        def with_cookie(status: str, headers: List[Tuple[str, str]], *exc_info: Any) -> Any:
            return start_response(status, list(headers) + [("Set-Cookie", set_cookie)], *exc_info)

        return self.app(environ, with_cookie)
