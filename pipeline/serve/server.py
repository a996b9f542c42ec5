"""The ``rag serve`` process: check the exposure, bind the port, serve, and stop without losing work.

The port is bound (and listening) before anything is announced, so an address in use or one that
is not this machine's is one error line (exit 2), not uvicorn's log after "serving on"; the line
that names the page's address is printed only once the server answers there, so a script that
waits for it never races the server. Each request then gets one access-log line (:mod:`.access`;
``--quiet`` turns them off). Ctrl-C and SIGTERM (what container runtimes send) both stop the
server gracefully, saying so: answers in flight get a few seconds to finish and are then
cancelled (a 503), then a running ingest is waited for; a second signal stops at once (the store
is crash-safe).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import ConfigError, InputError
from .folders import ReadableFolders
from .guards import is_loopback
from .limits import (ANSWERS_GRACE_SECONDS, DEFAULT_MAX_BODY, DEFAULT_MAX_UPLOAD, DEFAULT_PORT,
                     GRACEFUL_SHUTDOWN_SECONDS, MAX_HEADER_BYTES)

if TYPE_CHECKING:
    from ..api import Pipeline
    from .handlers import Served
    from .writer import IngestWriter

TOKEN_ENV = "RAG_SERVE_TOKEN"
BACKLOG = 2048  # uvicorn's
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def check_exposure(host: str, token: str | None, *, insecure: bool) -> None:
    """Refuse to listen off loopback without a token, unless ``insecure`` says to."""
    if not token and not insecure and not is_loopback(host):
        raise ConfigError(f"refusing to listen on {host} without {TOKEN_ENV}: anyone who can reach the port could "
                          f"read and ingest with it. Set {TOKEN_ENV}, or pass --insecure to serve it anyway")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or an :class:`InputError` that says why not."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise InputError(f"cannot listen on {where}: {host!r} is not an address of this machine "
                         f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)  # connections from now on wait in the queue; none is refused
    except OSError as exc:
        sock.close()
        why = {errno.EADDRINUSE: "the port is in use (another server?): choose another with --port",
               errno.EADDRNOTAVAIL: "that is not an address of this machine",
               errno.EACCES: "permission denied (ports below 1024 need privileges)"}.get(exc.errno, exc.strerror)
        raise InputError(f"cannot listen on {where}: {why}") from None
    return sock


def run(rag: "Pipeline", *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
        max_body: int = DEFAULT_MAX_BODY, max_upload: int = DEFAULT_MAX_UPLOAD, insecure: bool = False,
        allow: Sequence[str] | None = None, allow_hosts: Sequence[str] | None = None,
        cors_origins: Sequence[str] | None = None, log: Callable[[str], None] = print, quiet: bool = False) -> None:
    """Serve ``rag`` until interrupted (uvicorn; one process, one event loop). Settings left at None
    come from ``rag.config.serve``; ``log`` gets the start-up and stop lines and, unless ``quiet``,
    one line per request."""
    import uvicorn

    from .app import create_app

    check_exposure(host, token, insecure=insecure)
    folders = ReadableFolders(rag.config.serve.allow if allow is None else allow)  # checked before binding
    sock = bind(host, port)
    port = sock.getsockname()[1]
    try:
        app = create_app(rag, token=token, max_body=max_body, max_upload=max_upload, host=host, port=port,
                         allow=folders.roots, allow_hosts=allow_hosts, cors_origins=cors_origins,
                         access_log=None if quiet else log)
        rag.preload()  # the generator loads while the server starts: a first question waits retrieval plus TTFT
    except BaseException:
        sock.close()
        raise
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    access = "bearer token required" if token else "no token: local use only"
    reads = (f"/ingest and the page's uploads use {', '.join(map(str, folders.roots))}" if folders.enabled
             else "/ingest and uploads are off: --allow DIR turns them on")
    announce = [f"serving {rag.config.store.collection!r} on {url}: open {url}/ in a browser to ask, or use "
                f"{url}/v1 from an OpenAI client ({access}; {reads})"]
    if not token and not is_loopback(host):
        announce.append(f"warning: listening on {host} without {TOKEN_ENV} (--insecure): anyone who can reach it "
                        "can use it")
    # h11, not httptools: httptools accepts headers of any size, h11 refuses them past a bound.
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS, http="h11",
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES)
    with _signals_stop_the_server() as signals:
        _server(config, app.state.served, announce, log, early=signals.received).run(sockets=[sock])
    _drain(app.state.writer, log)
    log("stopped")


def _server(config, served: "Served", announce: list[str], log: Callable[[str], None], *, early: list[int]):
    """uvicorn's server, which announces itself once it answers, says when it is asked to stop, and
    cancels the answers still running shortly before its grace period ends: each then gets a 503
    it can act on, where uvicorn would cut it off with a bare 500. A signal that came before uvicorn
    took over the signals (``early``) stops it as soon as it has started."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        loop = None

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if early:  # asked to stop while starting
                self.handle_exit(early[0], None)
                return
            if self.started:  # the listening socket is served by the event loop from here on
                for line in announce:
                    log(line)

        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit and self.loop is not None:  # a signal handler: hand it to the loop
                self.loop.call_soon_threadsafe(self._stopping, sig)
            super().handle_exit(sig, frame)

        def _stopping(self, sig) -> None:
            n = len(served.answers)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            one = n == 1
            log(f"stopping ({name}): " + (f"{_answers(n)} in flight {'gets' if one else 'get'} "
                                          f"{ANSWERS_GRACE_SECONDS} s to finish, then {'is' if one else 'are'} "
                                          "cancelled (503); a second signal stops at once" if n
                                          else "no answer in flight"))
            self.loop.call_later(ANSWERS_GRACE_SECONDS, self._cancel_answers)

        def _cancel_answers(self) -> None:
            n = served.stop_answers()
            if n:
                log(f"cancelled {_answers(n)} still running: {'each' if n > 1 else 'its'} client gets a 503")

    return Server(config)


def _answers(n: int) -> str:
    return f"{n} answer{'s' if n != 1 else ''}"


class _signals_stop_the_server:
    """Ctrl-C and SIGTERM both end the server gracefully: uvicorn handles them while it serves and
    raises them again once it has stopped, where Python's defaults would end the process (SIGTERM)
    before a running ingest commits. Here they are noted instead, and the ingest is waited for."""

    def __enter__(self):
        self.previous = {}
        self.received: list[int] = []  # those that came while uvicorn did not handle them
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, lambda sig, frame: self.received.append(sig)) for s in _SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _drain(writer: "IngestWriter", log: Callable[[str], None]) -> None:
    writer.stop_warming()  # section states: those saved stay, the next ingest saves the rest
    if not writer.busy:
        writer.wait_idle()  # within a micro-batch
        return
    log("waiting for the running ingest to finish (Ctrl-C or SIGTERM again stops now: the store is crash-safe, "
        "the next ingest finishes the job)")
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:  # the writer thread is mid-document; freeing the models under it would crash
            signal.signal(s, lambda sig, frame: os._exit(128 + sig))
    writer.wait_idle()
