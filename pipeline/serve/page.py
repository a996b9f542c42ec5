"""The web page at ``/``: one HTML file, its scripts and its style, shipped in ``web/`` beside this module.

No build step and nothing from elsewhere (the page works offline). It asks through the
same endpoints as any client (``GET /collections``, ``GET /status``, ``POST /v1/chat/completions``
streaming, ``PUT /upload``), sending the token as a header. Answers are rendered as Markdown by
``web/markdown.js``, which builds DOM nodes and never parses text as HTML; conversations are kept
in the browser by ``web/history.js``. The files hold no data, so they are the only routes
besides ``/health`` open without the token (the page must load to ask for it); the Host
and Origin checks still apply to them. Each is sent with a Content-Security-Policy that
allows scripts and styles from the server itself only: no inline script, no ``eval``, no
other site, no framing.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

#: The page's files: URL path -> (file in ``web/``, content type).
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/web/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/web/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/web/history.js": ("history.js", "text/javascript; charset=utf-8"),
    "/web/page.css": ("page.css", "text/css; charset=utf-8"),
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


@lru_cache(maxsize=None)
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("web", name).read_bytes()


def endpoint(path: str):
    """The handler serving the page's file at ``path`` (one of :data:`ASSETS`)."""
    from starlette.responses import Response

    name, kind = ASSETS[path]

    async def asset(request):
        return Response(_read(name), headers=HEADERS, media_type=kind)

    return asset
