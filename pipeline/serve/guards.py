"""Who the server answers: the checks every request passes before any handler runs.

In order: the ``Host`` header must name the address the server listens on (or a name
given with ``--allow-host``), the defence against DNS rebinding that Jupyter and others
use: a page on ``evil.example`` whose name was rebound to 127.0.0.1 still sends
``Host: evil.example``. A browser's ``Origin`` must be the server's own or one given
with ``--cors-origin`` (those get CORS headers and preflight answers). With a token
(``RAG_SERVE_TOKEN``), every request needs it but those for the paths the app leaves open
(``/health`` and the web page's files, which hold no data). A ``POST`` body must be
``Content-Type: application/json``: a browser sends a cross-site form or ``text/plain``
POST without asking first, never JSON.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

from .http_errors import error_response

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
_PREFLIGHT_HEADERS = {"access-control-allow-methods": "GET, POST, PUT, OPTIONS",
                      "access-control-allow-headers": "Authorization, Content-Type",
                      "access-control-max-age": "600"}


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the server on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header text as (lower-case name, port or None); None when it cannot be a host."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep:
            return None
    elif value.count(":") > 1:  # a bare IPv6 address
        name, rest = value, ""
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit()):
        return None
    name = name.rstrip(".")
    return (name, int(rest[1:]) if rest else None) if name else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Policy:
    """The Host, Origin and token rules of one server, made by :meth:`make`."""

    port: int
    names: frozenset[str]  # host names accepted with the server's port
    any_ip: bool  # listening on every address: any IP literal (those cannot be rebound)
    extra: frozenset[tuple[str, int | None]]  # --allow-host entries (port None: any port)
    any_host: bool
    origins: frozenset[str]
    any_origin: bool
    token: str | None
    open_paths: frozenset[str] = frozenset({"/health"})  # answered without the token

    @classmethod
    def make(cls, *, host: str, port: int, allow_hosts: Sequence[str] = (), cors_origins: Sequence[str] = (),
             token: str | None = None, open_paths: Sequence[str] = ("/health",)) -> "Policy":
        bound = host.strip("[]").lower()
        unspecified = bound in ("", "0.0.0.0", "::")
        names = {"localhost"} if unspecified else {bound}
        if is_loopback(bound):
            names |= set(LOOPBACK_NAMES)
        extra = {parsed for h in allow_hosts if h != "*" and (parsed := split_host(h))}
        return cls(port=port, names=frozenset(names), any_ip=unspecified, extra=frozenset(extra),
                   any_host="*" in allow_hosts, origins=frozenset(o.rstrip("/").lower() for o in cors_origins),
                   any_origin="*" in cors_origins, token=token or None, open_paths=frozenset(open_paths))

    def host_allowed(self, value: str | None) -> bool:
        if self.any_host:
            return True
        parsed = split_host(value) if value else None
        if parsed is None:
            return False
        name, port = parsed
        if (name, None) in self.extra or (name, port) in self.extra:
            return True
        return port == self.port and (name in self.names or (self.any_ip and _is_ip(name)))

    def origin(self, origin: str, host: str) -> str | None:
        """"same" (the page is the server's own), "cors" (an allowed other origin) or None (refused)."""
        origin = origin.rstrip("/").lower()
        if origin != "null" and urlsplit(origin).netloc == host.strip().lower():
            return "same"
        return "cors" if self.any_origin or origin in self.origins else None

    def token_ok(self, authorization: str) -> bool:
        return self.token is None or hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode())


# Headers the guard decides on: a second copy of one is refused, never resolved either way.
_SINGLE = frozenset({"host", "origin", "authorization", "content-type", "content-length"})


class Guard:
    """ASGI middleware applying a :class:`Policy` to every HTTP request."""

    def __init__(self, app, policy: Policy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        repeated = None
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            if name in headers and name in _SINGLE:
                repeated = name
            headers[name] = v.decode("latin-1")
        if repeated is not None:  # the guard and the app could read different values (RFC 9110 §5.3)
            refusal = error_response(400, f"the request has more than one {repeated.title()} header",
                                     "invalid_request_error", "repeated_header")
            return await refusal(scope, receive, send)
        refusal, cors = self._check(scope, headers)
        await (refusal or self.app)(scope, receive, send if cors is None else _with_cors(send, cors))

    def _check(self, scope, headers: dict[str, str]):
        """(a response that refuses or answers the request, or None; the origin to send CORS headers to)."""
        p, method, path = self.policy, scope["method"], scope["path"]
        host = headers.get("host")
        if not p.host_allowed(host):
            return error_response(403, f"this server does not answer for the host {host!r}: it answers for the "
                                  "address it listens on, and names given with --allow-host", "permission_error",
                                  "host_not_allowed"), None
        origin = headers.get("origin")
        kind = p.origin(origin, host) if origin is not None else "same"
        if kind is None:
            return error_response(403, f"cross-origin requests from {origin!r} are refused: start the server with "
                                  f"--cors-origin {origin} to allow that site's pages", "permission_error",
                                  "origin_not_allowed"), None
        cors = origin if kind == "cors" else None
        if origin is not None and method == "OPTIONS" and "access-control-request-method" in headers:
            from starlette.responses import Response

            return Response(status_code=204, headers=_PREFLIGHT_HEADERS), origin
        if path not in p.open_paths and not p.token_ok(headers.get("authorization", "")):
            return error_response(401, "missing or wrong bearer token", "authentication_error"), cors
        if method == "POST" and headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return error_response(415, "a POST body must be JSON sent with Content-Type: application/json",
                                  "invalid_request_error", "unsupported_media_type"), cors
        return None, cors


def _with_cors(send, origin: str):
    """``send`` with the CORS headers that let a page from ``origin`` read the response."""
    async def send_with_cors(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"access-control-allow-origin", origin.encode("latin-1")),
                                              (b"vary", b"Origin")]}
        await send(message)
    return send_with_cors
