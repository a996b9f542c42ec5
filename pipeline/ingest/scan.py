"""Which files an ingest run looks at: the paths given, walked safely, and identified by content.

The walk never opens anything but regular files and never stops at a bad entry:
FIFOs, sockets and device files, symlink loops, broken links, links that leave
the folder, unreadable folders and paths longer than the system allows are each
reported with a reason, and the rest of the tree is still scanned.

Symlinks: a link whose target lies inside the folder being ingested is followed
(files and folders); a link that leaves it is reported and skipped unless
``follow_symlinks`` is set. Either way a document is known by the path it was
found at (absolute, links not resolved), never by the link's target, so when the
link goes away ``--prune`` removes the document. (Only the folders given, and the folder
holding each file given, are resolved: a store keeps the names it had when ``/home`` or
``/tmp`` is itself a link, or the folder given is.)

A folder that could not be read completely is listed in :attr:`Scan.protected`,
as are files and folders present but not selected (hidden, or filtered out by
``include``/``exclude``): documents under them are never reported missing or
pruned, because their files may well still be there.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

from ..errors import InputError, LoadError


@dataclass(frozen=True)
class ScannedFile:
    """A regular file to consider: ``path`` is absolute, as found (links not resolved), and is the
    document's source."""

    path: Path
    size: int
    mtime_ns: int
    via_link: bool = False


@dataclass(frozen=True)
class Problem:
    """A path the scan did not take, and why. ``status`` is "skipped" (not a document: special
    files, links) or "failed" (should be readable and is not: unreadable folders)."""

    path: str
    status: str
    reason: str


@dataclass
class Scan:
    """The outcome of :func:`scan`."""

    files: list[ScannedFile] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)  # the folders given, absolute
    problems: list[Problem] = field(default_factory=list)
    protected: set[str] = field(default_factory=set)  # paths whose documents must never be pruned

    def is_protected(self, source: str) -> bool:
        """True if ``source`` is, or lies under, a path that was present but not (fully) read."""
        path = Path(source)
        return any(str(p) in self.protected for p in (path, *path.parents))

    def covers(self, source: str) -> bool:
        """True if ``source`` lies under a folder given: the run speaks for it (files named directly
        always exist, or the scan fails)."""
        path = Path(source)
        return any(folder == path or folder in path.parents for folder in self.folders)


def source_name(path: str | Path) -> Path:
    """How a document at ``path`` (a path given by the user) is named: absolute, the folder that
    holds it resolved, its own name kept even when it is a link."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    if not path.name:
        return path  # the root folder
    return Path(os.path.realpath(path.parent)) / path.name


def source_names(path: str | Path) -> list[str]:
    """The names a document given as ``path`` may have in a store, most likely first (for lookups:
    below a linked folder, documents keep the link's path)."""
    names = [str(source_name(path)), os.path.abspath(Path(path).expanduser()), os.path.realpath(path)]
    return list(dict.fromkeys(names))


def matches(rel: str, name: str, patterns: Sequence[str]) -> bool:
    """Shell-style globs: against the name, or against the relative path when a pattern has a '/'."""
    return any(fnmatchcase(rel if "/" in p else name, p.rstrip("/")) for p in patterns)


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a folder"))


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "path longer than the system allows (PATH_MAX): its files cannot be opened"
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    return exc.strerror or str(exc)


def scan(paths: Iterable[str | Path], *, include: Sequence[str] = (), exclude: Sequence[str] = (),
         follow_symlinks: bool = False) -> Scan:
    """Regular files under ``paths`` (hidden files and folders skipped), with what was left out and why.

    ``include`` keeps only files matching one of its globs; ``exclude`` drops files and folders
    matching one of its. Files named directly are taken whatever the filters say. A path
    that does not exist is an :class:`InputError`, raised before anything else happens.
    """
    given = [source_name(p) for p in paths]
    missing = [str(p) for p in given if not os.path.lexists(p)]
    if missing:
        raise InputError("path does not exist: " + ", ".join(missing))
    walker = _Walker(include=tuple(include), exclude=tuple(exclude), follow_symlinks=follow_symlinks)
    for path in given:
        walker.root(path)
    return walker.result


class _Walker:
    def __init__(self, *, include: tuple[str, ...], exclude: tuple[str, ...], follow_symlinks: bool):
        self.include, self.exclude, self.follow = include, exclude, follow_symlinks
        self.result = Scan()
        self._sources: dict[str, int] = {}  # source -> index in result.files
        self._by_inode: dict[tuple[int, int], int] = {}  # (dev, inode) -> first index in result.files
        self._visited: set[tuple[int, int]] = set()  # folders walked

    def _problem(self, path: Path | str, status: str, reason: str) -> None:
        self.result.problems.append(Problem(str(path), status, reason))

    def root(self, path: Path) -> None:
        try:
            st = os.stat(path)
        except OSError as exc:
            self._problem(path, "skipped" if exc.errno in (errno.ELOOP, errno.ENOENT) else "failed",
                          "broken symlink" if exc.errno == errno.ENOENT else _os_reason(exc))
            return
        if stat.S_ISDIR(st.st_mode):
            path = Path(os.path.realpath(path))  # a folder given is where documents are; below it, names as found
            self.result.folders.append(path)
            self._walk(path, st)
        elif stat.S_ISREG(st.st_mode):
            self._add(path, st, via_link=False)
        else:
            self._problem(path, "skipped", f"not a regular file: {kind_of(st.st_mode)}")

    def _add(self, path: Path, st: os.stat_result, *, via_link: bool) -> None:
        source = str(path)
        if source in self._sources:
            return  # named twice (overlapping paths given)
        key = (st.st_dev, st.st_ino)
        at = self._by_inode.get(key)
        if at is not None and (via_link or self.result.files[at].via_link):
            # One file reached twice, once through a link: keep one, under the file's own path.
            if self.result.files[at].via_link and not via_link:
                del self._sources[str(self.result.files[at].path)]
                self.result.files[at] = ScannedFile(path, st.st_size, st.st_mtime_ns, via_link)
                self._sources[source] = at
            return
        self._sources[source] = len(self.result.files)
        self._by_inode.setdefault(key, len(self.result.files))
        self.result.files.append(ScannedFile(path, st.st_size, st.st_mtime_ns, via_link))

    def _walk(self, root: Path, st: os.stat_result) -> None:
        real_root = os.path.realpath(root)
        if (st.st_dev, st.st_ino) in self._visited:
            return
        self._visited.add((st.st_dev, st.st_ino))
        stack: list[tuple[Path, str]] = [(root, "")]  # (folder, its path relative to root + "/")
        linked_dirs: list[tuple[Path, str]] = []  # links to folders, walked last so real paths win
        while stack or linked_dirs:
            if not stack:
                link, link_rel = linked_dirs.pop(0)
                try:
                    target = os.stat(link)
                except OSError as exc:
                    self._problem(link, "failed", _os_reason(exc))
                    continue
                if (target.st_dev, target.st_ino) in self._visited:
                    self._problem(link, "skipped", "symlink to a folder already scanned (a loop or a duplicate)")
                    continue
                self._visited.add((target.st_dev, target.st_ino))
                stack.append((link, link_rel + "/"))
            folder, prefix = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self._problem(folder, "failed", "cannot read folder: " + _os_reason(exc))
                self.result.protected.add(str(folder))
                continue
            subfolders = []
            for entry in entries:
                path = folder / entry.name
                rel = prefix + entry.name
                if entry.name.startswith(".") or (self.exclude and matches(rel, entry.name, self.exclude)):
                    self.result.protected.add(str(path))
                    continue
                try:
                    if entry.is_symlink():
                        self._link(path, rel, real_root, linked_dirs)
                        continue
                    lst = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    self._problem(path, "failed", _os_reason(exc))
                    self.result.protected.add(str(path))
                    continue
                if stat.S_ISDIR(lst.st_mode):
                    if (lst.st_dev, lst.st_ino) not in self._visited:
                        self._visited.add((lst.st_dev, lst.st_ino))
                        subfolders.append((path, rel + "/"))
                elif stat.S_ISREG(lst.st_mode):
                    self._file(path, rel, lst, via_link=False)
                else:
                    self._problem(path, "skipped", f"not a regular file: {kind_of(lst.st_mode)}")
            stack.extend(reversed(subfolders))

    def _file(self, path: Path, rel: str, st: os.stat_result, *, via_link: bool) -> None:
        if self.include and not matches(rel, path.name, self.include):
            self.result.protected.add(str(path))
            return
        self._add(path, st, via_link=via_link)

    def _link(self, path: Path, rel: str, real_root: str, linked_dirs: list[tuple[Path, str]]) -> None:
        try:
            target = os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                self._problem(path, "skipped", f"broken symlink (to {os.readlink(path)})")
            else:
                self._problem(path, "skipped" if exc.errno == errno.ELOOP else "failed", _os_reason(exc))
            return
        real = os.path.realpath(path)
        if not stat.S_ISDIR(target.st_mode) and not stat.S_ISREG(target.st_mode):
            self._problem(path, "skipped", f"symlink to {kind_of(target.st_mode)} ({real})")
            return
        inside = real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
        if not inside and not self.follow:
            self._problem(path, "skipped", f"symlink leaves the folder (to {real}); "
                                           "--follow-symlinks includes such links")
            self.result.protected.add(str(path))  # a document from a run that followed it stays
            return
        if stat.S_ISDIR(target.st_mode):
            linked_dirs.append((path, rel))
        else:
            self._file(path, rel, target, via_link=True)


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; else :class:`LoadError`.

    Opened non-blocking first, so that a FIFO swapped in after the scan cannot hang the
    run (opening a FIFO waits for a writer), and checked on the open descriptor.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise LoadError(f"cannot read file: {_os_reason(exc)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise LoadError("cannot read file: Is a directory")
        if not stat.S_ISREG(mode):
            raise LoadError(f"not a regular file: {kind_of(mode)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
