"""The access log of ``rag serve``: one line per request, once its answer is sent (``--quiet``: none).

A line holds the client's address, the method, the path, the status and how long the answer took
(to its last byte: a streamed answer is logged when it ends), e.g.
``127.0.0.1 POST /v1/chat/completions 200 2.41 s``. It never holds a query string, a header or
a body, so neither the token, a question nor a document's name or text reaches the log.
A request whose client left before an answer began is logged with status 499, as nginx does.
"""

from __future__ import annotations

import time
from typing import Callable

#: Status logged for a request whose client closed the connection before any answer was sent.
CLIENT_CLOSED = 499


def line(client: str, method: str, path: str, status: int, seconds: float) -> str:
    took = f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
    return f"{client} {method} {_printable(path)} {status} {took}"


def _printable(path: str) -> str:
    """The path with control and other unprintable characters escaped, so one request stays one line."""
    return "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in path[:300]) + \
        ("..." if len(path) > 300 else "")


class AccessLog:
    """ASGI middleware: ``log(line)`` for every HTTP request once its answer is sent (or abandoned)."""

    def __init__(self, app, log: Callable[[str], None]):
        self.app, self.log = app, log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status: list[int] = []

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, sending)
        except Exception:  # answered 500 by the application's last handler, outside this one
            failed = True
            raise
        finally:
            client = (scope.get("client") or ("-",))[0]
            code = status[0] if status else (500 if failed else CLIENT_CLOSED)
            self.log(line(client, scope["method"], scope["path"], code, time.perf_counter() - started))
