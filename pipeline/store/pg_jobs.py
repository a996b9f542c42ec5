"""Summarisation job state in the PostgreSQL catalog (``store.catalog_url``), shared by every worker.

The same content-addressed units and results as :class:`pipeline.jobs.JobStore` (which
keeps them in ``jobs.sqlite`` beside an embedded store), in the tables of catalog schema
version 2 (:mod:`.pg_schema`). Every commit is one statement, so ``kill -9`` loses at
most the unit in flight, as with SQLite. :meth:`claim` lets workers on several machines
split units: a unit is worked on only by the worker holding its advisory lock, which the
server releases when that worker's connection ends.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

from ..jobs import KILL_HOOK, JobStore, StoredResult, Unit
from .pg_schema import upgrade
from .postgres import _key, connect
from .vectors import redact


class PostgresJobStore(JobStore):
    """:class:`~pipeline.jobs.JobStore` on PostgreSQL. One connection per instance; not shared between threads."""

    def __init__(self, url: str):
        self.path = redact(url)  # what messages name
        self._commits = 0
        kill = os.environ.get(KILL_HOOK, "")
        self._kill_after = int(kill) if kill.isdigit() else 0
        self.conn = connect(url)
        try:
            upgrade(self.conn, where=self.path)
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def _one(self, sql: str, args=()) -> tuple | None:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone() if cur.description else None

    @contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """True while this worker alone may compute unit ``key`` (False: another worker is on it)."""
        lock = _key("unit", key)
        got = bool(self._one("SELECT pg_try_advisory_lock(%s)", (lock,))[0])
        try:
            yield got
        finally:
            if got and not self.conn.closed:
                self._one("SELECT pg_advisory_unlock(%s)", (lock,))

    # -- jobs ---------------------------------------------------------------------------------

    def begin(self, job_id: str, *, collection: str, spec: dict) -> None:
        now = time.time()
        self._one("INSERT INTO jobs VALUES (%s, %s, %s, 'running', %s, %s) ON CONFLICT (job_id) DO UPDATE SET"
                  " state = 'running', updated_at = excluded.updated_at",
                  (job_id, collection, json.dumps(spec, sort_keys=True), now, now))

    def finish(self, job_id: str, state: str) -> None:
        self._one("UPDATE jobs SET state = %s, updated_at = %s WHERE job_id = %s", (state, time.time(), job_id))

    def job(self, job_id: str) -> dict | None:
        row = self._one("SELECT state, created_at, updated_at FROM jobs WHERE job_id = %s", (job_id,))
        return None if row is None else {"state": row[0], "created_at": row[1], "updated_at": row[2]}

    # -- units and results --------------------------------------------------------------------

    def unit(self, key: str) -> Unit | None:
        row = self._one("SELECT key, kind, text, prompt_tokens, prefill_tokens, decode_tokens, seconds"
                        " FROM units WHERE key = %s", (key,))
        return Unit(*row) if row else None

    def commit_unit(self, unit: Unit, *, doc_key: str, prompt_key: str, idx: str) -> None:
        self._one("INSERT INTO units VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE"
                  " SET text = excluded.text, prompt_tokens = excluded.prompt_tokens,"
                  " prefill_tokens = excluded.prefill_tokens, decode_tokens = excluded.decode_tokens,"
                  " seconds = excluded.seconds, finished_at = excluded.finished_at",
                  (unit.key, doc_key, prompt_key, unit.kind, idx, unit.text.replace("\x00", " "), unit.prompt_tokens,
                   unit.prefill_tokens, unit.decode_tokens, unit.seconds, time.time()))
        self._committed()

    def result(self, key: str) -> StoredResult | None:
        row = self._one("SELECT source, content_hash, prompt, method, sections, reduce_steps, levels, text"
                        " FROM results WHERE key = %s", (key,))
        return StoredResult(*row) if row else None

    def commit_result(self, key: str, result: StoredResult, *, doc_key: str, prompt_key: str) -> None:
        r = result
        self._one("INSERT INTO results VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                  " ON CONFLICT (key) DO UPDATE SET text = excluded.text, method = excluded.method,"
                  " sections = excluded.sections, reduce_steps = excluded.reduce_steps, levels = excluded.levels,"
                  " finished_at = excluded.finished_at",
                  (key, doc_key, prompt_key, r.source, r.content_hash, r.prompt, r.method, r.sections,
                   r.reduce_steps, r.levels, r.text.replace("\x00", " "), time.time()))
        self._committed()

    def units_done(self, doc_key: str, prompt_key: str) -> int:
        return self._one("SELECT COUNT(*) FROM units WHERE doc_key = %s AND prompt_key = %s",
                         (doc_key, prompt_key))[0]

    def forget(self, job_id: str, pairs: Iterable[tuple[str, str]]) -> int:
        n = 0
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute("DELETE FROM jobs WHERE job_id = %s", (job_id,))
            for doc_key, prompt_key in pairs:
                for table in ("units", "results"):
                    cur.execute(f"DELETE FROM {table} WHERE doc_key = %s AND prompt_key = %s", (doc_key, prompt_key))
                    n += cur.rowcount
        return n
