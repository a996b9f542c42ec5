"""What ``POST /ingest`` may read: the folders the operator allowed (``--allow``, ``serve.allow``).

Every requested path is resolved as the file system will see it (symlinks followed,
``..`` applied) and must name an existing file or folder under an allowed folder;
a relative path is taken against the allowed folders, never the server's working
directory. Every refusal has the same answer, whether the path lies outside, leaves
through a symlink, climbs out with ``..``, is ``/`` or does not exist, so a client
learns nothing about files it may not read. Inside a folder, the scanner's own rule
applies: links that leave the folder are reported and skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError
from .http_errors import HTTPError

#: The one answer to a path the server may not read (identical for every reason).
NOT_ALLOWED = ("each path must name an existing file or folder inside the folders this server may read "
               "(rag serve --allow DIR), a relative path one inside them; this request names one that is not")
#: The answer when no folder is allowed at all.
INGEST_OFF = ("this server reads no files: /ingest is off. Start it with `rag serve --allow DIR` (or set "
              "serve.allow = [\"DIR\"]) to let /ingest read the files under DIR")


class ReadableFolders:
    """The allowed folders, resolved once when the server starts."""

    def __init__(self, folders: Sequence[str | Path]):
        roots = []
        for folder in folders:
            try:
                root = Path(os.path.realpath(Path(folder).expanduser(), strict=True))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"serve.allow: {folder} cannot be read ({getattr(exc, 'strerror', None) or exc})"
                                  ) from None
            if not root.is_dir():
                raise ConfigError(f"serve.allow: {folder} is not a folder")
            roots.append(root)
        self.roots = tuple(dict.fromkeys(roots))

    @property
    def enabled(self) -> bool:
        return bool(self.roots)

    def require(self) -> None:
        """A 403 that says how to turn ``/ingest`` on, when no folder is allowed."""
        if not self.enabled:
            raise HTTPError(403, INGEST_OFF, "permission_error", code="ingest_disabled")

    def resolve(self, requested: str) -> Path:
        """The real path of ``requested`` if it may be read, else the one 403 (:data:`NOT_ALLOWED`)."""
        self.require()
        if "\0" in requested:
            raise _refused()
        path = Path(requested)
        candidates = [path] if path.is_absolute() else [root / path for root in self.roots]
        for candidate in candidates:
            try:
                real = Path(os.path.realpath(candidate, strict=True))
                readable = real.is_dir() or real.is_file()
            except (OSError, ValueError):  # missing, a loop, too long, not encodable
                continue
            if readable and any(real == root or root in real.parents for root in self.roots):
                return real
        raise _refused()


def _refused() -> HTTPError:
    return HTTPError(403, NOT_ALLOWED, "permission_error", code="path_not_allowed")
