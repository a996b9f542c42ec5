"""Resumable job state for ``rag summarize``: every finished unit of work, committed as it completes.

:class:`JobStore` is what a job asks of its state, whichever database keeps it:
:class:`SQLiteJobStore` (``jobs.sqlite`` beside an embedded store's catalog, with its own
schema version, so it migrates independently of the catalog) or
:class:`~.jobstore_pg.PostgresJobStore` (in the shared PostgreSQL catalog). Work is
content-addressed:

- a *unit* (a whole-document prompt, one section's map prompt, one reduce step) is
  keyed by a hash of everything its output depends on: the model and the settings
  that shape generation, the document's path and content hash, the section's chunk
  range, the instruction, and for a reduce step the texts it combines;
- a *result* (one document × prompt, finished) is keyed by the settings, the
  document and the prompt.

So the same command run again finds what was finished and does only the rest, a
changed document (a new content hash) gets new keys and redoes only its own units,
and several jobs over overlapping documents share their work. Each commit is one
transaction, so ``kill -9`` at any moment loses at most the unit in flight; the crash
tests stop a real ``rag summarize`` right after its Nth commit through the crash point
``AFTER_COMMITS`` (:mod:`pipeline._testhooks`).

Several workers (threads, processes, machines) split one job through leases on its
documents: :meth:`JobStore.claim`, :meth:`~JobStore.renew`, :meth:`~JobStore.release`
(see :mod:`.spread`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from .._sqlite import connect, transaction
from .._testhooks import crash_point
from ..errors import StoreError

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, collection TEXT, spec TEXT, state TEXT, created_at REAL, updated_at REAL);
CREATE TABLE IF NOT EXISTS units (
    key TEXT PRIMARY KEY, doc_key TEXT, prompt_key TEXT, kind TEXT, idx TEXT, text TEXT,
    prompt_tokens INTEGER, prefill_tokens INTEGER, decode_tokens INTEGER, seconds REAL, finished_at REAL);
CREATE INDEX IF NOT EXISTS units_by_doc ON units (doc_key, prompt_key);
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY, doc_key TEXT, prompt_key TEXT, source TEXT, content_hash TEXT, prompt TEXT,
    method TEXT, sections INTEGER, reduce_steps INTEGER, levels INTEGER, text TEXT, finished_at REAL);
CREATE INDEX IF NOT EXISTS results_by_doc ON results (doc_key, prompt_key);
CREATE TABLE IF NOT EXISTS claims (
    job_id TEXT, item TEXT, worker TEXT, lease_until REAL, done INTEGER, attempts INTEGER,
    PRIMARY KEY (job_id, item));
"""


@dataclass(frozen=True)
class Unit:
    """One finished piece of work and what it cost when it was computed."""

    key: str
    kind: str  # whole | map | reduce
    text: str
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class StoredResult:
    """One finished document × prompt."""

    source: str
    content_hash: str
    prompt: str
    method: str  # whole | map-reduce
    sections: int
    reduce_steps: int
    levels: int
    text: str


class JobStore(Protocol):
    """The job state of one store. One connection per instance; an instance is not shared between threads
    (:meth:`reopen` gives another thread or worker its own)."""

    #: What messages name the job state by (a file, or a URL without its password).
    path: object

    def close(self) -> None: ...

    def __enter__(self) -> "SQLiteJobStore": ...

    def __exit__(self, *exc) -> None: ...

    def reopen(self) -> "JobStore":
        """Another connection to the same job state (for another thread or worker)."""

    # -- jobs -----------------------------------------------------------------------------------

    def begin(self, job_id: str, *, collection: str, spec: dict) -> None: ...

    def finish(self, job_id: str, state: str) -> None: ...

    def job(self, job_id: str) -> dict | None:
        """``{"state", "created_at", "updated_at"}`` of a job, or None if it never began."""

    # -- units and results ----------------------------------------------------------------------

    def unit(self, key: str) -> Unit | None: ...

    def commit_unit(self, unit: Unit, *, doc_key: str, prompt_key: str, idx: str) -> None: ...

    def commit_units(self, units: Sequence[tuple[Unit, str, str, str]]) -> None:
        """Commit ``(unit, doc_key, prompt_key, idx)`` rows in one transaction (one commit): units decoded
        together are finished together, so a resumed job decodes the same group again, never part of it."""

    def result(self, key: str) -> StoredResult | None: ...

    def commit_result(self, key: str, result: StoredResult, *, doc_key: str, prompt_key: str) -> None: ...

    def units_done(self, doc_key: str, prompt_key: str) -> int: ...

    def forget(self, job_id: str, pairs: Iterable[tuple[str, str]]) -> int:
        """Delete a job's record and the units and results of its (document key, prompt key) pairs; the
        number of units and results deleted."""

    # -- claims: several workers on one job -----------------------------------------------------

    def claim(self, job_id: str, items: Sequence[str], *, worker: str, lease: float) -> str | None:
        """Take the first of ``items`` that is neither done nor held under a live lease, for ``lease``
        seconds, in one transaction (so two workers never take the same item); None if there is none.
        An item whose holder stopped renewing (a crashed worker) is free again once its lease ends."""

    def renew(self, job_id: str, item: str, *, worker: str, lease: float) -> bool:
        """Extend ``worker``'s lease on ``item``; False if the item is no longer its own."""

    def release(self, job_id: str, item: str, *, worker: str, done: bool) -> None:
        """Mark ``item`` done, or give it back (lease ended now) for another worker to take."""

    def claims(self, job_id: str) -> dict[str, dict]:
        """Per item: who took it last, whether it is done, how many times it was taken."""

    def clear_finished_claims(self, job_id: str) -> None:
        """Forget the claims a finished run left done (a new run: stored results decide what is left,
        and documents that failed are tried again); live leases of other workers stay."""


class SQLiteJobStore:
    """The :class:`JobStore` of an embedded store: ``jobs.sqlite`` in its directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = connect(self.path)
        except (sqlite3.DatabaseError, OSError) as exc:
            raise StoreError(f"cannot open the job database {self.path}: {exc}") from None
        try:
            row = self._schema_row()
            if row is None:
                # A new database: created in one write transaction, so that processes creating it at
                # the same moment wait their turn; the schema row is written last, with the tables.
                with transaction(self.db):
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        self.db.execute(statement)
                    self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                row = self._schema_row()
            if int(row[0]) > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer version (job schema {row[0]}, "
                                 f"this one reads {SCHEMA_VERSION}): upgrade rag or use another store")
        except (sqlite3.DatabaseError, OSError) as exc:
            self.db.close()
            raise StoreError(f"cannot open the job database {self.path}: {exc}") from None
        except StoreError:
            self.db.close()
            raise

    def _schema_row(self) -> tuple | None:
        """The schema version row; None in a database not created yet (opening one needs no write)."""
        try:
            return self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "SQLiteJobStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reopen(self) -> "SQLiteJobStore":
        return type(self)(self.path)

    # -- jobs ---------------------------------------------------------------------------------

    def begin(self, job_id: str, *, collection: str, spec: dict) -> None:
        now = time.time()
        self.db.execute(
            "INSERT INTO jobs VALUES (?, ?, ?, 'running', ?, ?) ON CONFLICT (job_id) DO UPDATE SET"
            " state = 'running', updated_at = excluded.updated_at",
            (job_id, collection, json.dumps(spec, sort_keys=True), now, now))

    def finish(self, job_id: str, state: str) -> None:
        self.db.execute("UPDATE jobs SET state = ?, updated_at = ? WHERE job_id = ?", (state, time.time(), job_id))

    def job(self, job_id: str) -> dict | None:
        row = self.db.execute("SELECT state, created_at, updated_at FROM jobs WHERE job_id = ?",
                              (job_id,)).fetchone()
        return None if row is None else {"state": row[0], "created_at": row[1], "updated_at": row[2]}

    # -- units and results --------------------------------------------------------------------

    def unit(self, key: str) -> Unit | None:
        row = self.db.execute("SELECT key, kind, text, prompt_tokens, prefill_tokens, decode_tokens, seconds"
                              " FROM units WHERE key = ?", (key,)).fetchone()
        return Unit(*row) if row else None

    def commit_unit(self, unit: Unit, *, doc_key: str, prompt_key: str, idx: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (unit.key, doc_key, prompt_key, unit.kind, idx, unit.text, unit.prompt_tokens,
                         unit.prefill_tokens, unit.decode_tokens, unit.seconds, time.time()))
        self._committed()

    def commit_units(self, units: Sequence[tuple[Unit, str, str, str]]) -> None:
        """Commit ``(unit, doc_key, prompt_key, idx)`` rows in one transaction (one commit): units decoded
        together are finished together, so a resumed job decodes the same group again, never part of it."""
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany("INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                [(u.key, dk, pk, u.kind, idx, u.text, u.prompt_tokens, u.prefill_tokens,
                                  u.decode_tokens, u.seconds, now) for u, dk, pk, idx in units])
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        self._committed()

    def result(self, key: str) -> StoredResult | None:
        row = self.db.execute("SELECT source, content_hash, prompt, method, sections, reduce_steps, levels, text"
                              " FROM results WHERE key = ?", (key,)).fetchone()
        return StoredResult(*row) if row else None

    def commit_result(self, key: str, result: StoredResult, *, doc_key: str, prompt_key: str) -> None:
        r = result
        self.db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (key, doc_key, prompt_key, r.source, r.content_hash, r.prompt, r.method, r.sections,
                         r.reduce_steps, r.levels, r.text, time.time()))
        self._committed()

    def units_done(self, doc_key: str, prompt_key: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM units WHERE doc_key = ? AND prompt_key = ?",
                               (doc_key, prompt_key)).fetchone()[0]

    def forget(self, job_id: str, pairs: Iterable[tuple[str, str]]) -> int:
        """Delete a job's record and the units and results of its (document key, prompt key) pairs.

        Returns the number of units and results deleted.
        """
        n = 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            self.db.execute("DELETE FROM claims WHERE job_id = ?", (job_id,))
            for doc_key, prompt_key in pairs:
                for table in ("units", "results"):
                    n += self.db.execute(f"DELETE FROM {table} WHERE doc_key = ? AND prompt_key = ?",
                                         (doc_key, prompt_key)).rowcount
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return n

    # -- claims: several workers on one job -----------------------------------------------------

    def claim(self, job_id: str, items: Sequence[str], *, worker: str, lease: float) -> str | None:
        """Take the first of ``items`` that is neither done nor held under a live lease, for ``lease``
        seconds, in one transaction (so two workers never take the same item); None if there is none.

        An item whose holder stopped renewing (a crashed worker) is free again once its lease ends.
        """
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            held = {row[0]: row[1:] for row in self.db.execute(
                "SELECT item, done, lease_until, attempts FROM claims WHERE job_id = ?", (job_id,))}
            for item in items:
                done, lease_until, attempts = held.get(item, (0, 0.0, 0))
                if done or lease_until > now:
                    continue
                self.db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, 0, ?)",
                                (job_id, item, worker, now + lease, attempts + 1))
                self.db.execute("COMMIT")
                return item
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return None

    def renew(self, job_id: str, item: str, *, worker: str, lease: float) -> bool:
        """Extend ``worker``'s lease on ``item``; False if the item is no longer its own."""
        return self.db.execute("UPDATE claims SET lease_until = ? WHERE job_id = ? AND item = ? AND worker = ?"
                               " AND done = 0", (time.time() + lease, job_id, item, worker)).rowcount == 1

    def release(self, job_id: str, item: str, *, worker: str, done: bool) -> None:
        """Mark ``item`` done, or give it back (lease ended now) for another worker to take."""
        if done:
            self.db.execute("UPDATE claims SET done = 1 WHERE job_id = ? AND item = ? AND worker = ?",
                            (job_id, item, worker))
        else:
            self.db.execute("UPDATE claims SET lease_until = 0 WHERE job_id = ? AND item = ? AND worker = ?"
                            " AND done = 0", (job_id, item, worker))

    def claims(self, job_id: str) -> dict[str, dict]:
        """Per item: who took it last, whether it is done, how many times it was taken."""
        return {row[0]: {"worker": row[1], "done": bool(row[2]), "attempts": row[3], "lease_until": row[4]}
                for row in self.db.execute("SELECT item, worker, done, attempts, lease_until FROM claims"
                                           " WHERE job_id = ?", (job_id,))}

    def clear_finished_claims(self, job_id: str) -> None:
        """Forget the claims a finished run left done (a new run: stored results decide what is left,
        and documents that failed are tried again); live leases of other workers stay."""
        self.db.execute("DELETE FROM claims WHERE job_id = ? AND done = 1", (job_id,))

    def _committed(self) -> None:
        crash_point("AFTER_COMMITS")
