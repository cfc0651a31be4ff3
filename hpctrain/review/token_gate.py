"""A WSGI gate that lets in only who holds the token (as Jupyter does): ``?token=...`` on any request sets
an HttpOnly, SameSite=Strict cookie; afterwards the cookie suffices; anything else is 403."""

import hashlib
import hmac
from http.cookies import SimpleCookie
from typing import Any, Callable, Iterable, List, Tuple
from urllib.parse import parse_qs

WSGIApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]
FORBIDDEN = (b"403 Forbidden: this TensorBoard is opened with its token. Open the URL `hpctrain tensorboard` "
             b"printed (it ends in ?token=...).\n")


def cookie_name(port: int) -> str:
    """Per port: cookies are shared by every port of a host, and several TensorBoards may run on one."""
    return f"hpctrain-tb-{port}"


class TokenGate:
    def __init__(self, app: WSGIApp, token: str, port: int) -> None:
        self.app = app
        self._token = token.encode()
        # the cookie holds a value derived from the token, not the token itself
        self._cookie_value = hmac.new(self._token, b"hpctrain tensorboard cookie", hashlib.sha256).hexdigest()
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
        if self._has_cookie(environ):
            return self.app(environ, start_response)
        if not self._has_token(environ):
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                             ("Content-Length", str(len(FORBIDDEN)))])
            return [FORBIDDEN]
        set_cookie = f"{self._cookie}={self._cookie_value}; Path=/; HttpOnly; SameSite=Strict"

        def with_cookie(status: str, headers: List[Tuple[str, str]], *exc_info: Any) -> Any:
            return start_response(status, list(headers) + [("Set-Cookie", set_cookie)], *exc_info)

        return self.app(environ, with_cookie)
