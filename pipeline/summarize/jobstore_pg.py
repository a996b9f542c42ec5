"""Summarisation job state in the PostgreSQL catalog (``store.catalog_url``), shared by every worker.

The :class:`~.jobstore.JobStore` of a store whose catalog is in PostgreSQL: the same
content-addressed units and results as :class:`~.jobstore.SQLiteJobStore` (which keeps them
in ``jobs.sqlite`` beside an embedded store), in the tables of catalog schema version 2
(:mod:`pipeline.store.pg_schema`). Every commit is one statement (or one transaction), so
``kill -9`` loses at most the unit in flight, as with SQLite. Workers on several machines
split one job through the same leases (:meth:`~.jobstore.JobStore.claim`, ``renew``,
``release``): a claim runs in one transaction under an advisory lock on the job, so two
workers never take the same item, and a crashed worker's items are free once its lease ends.
"""

from __future__ import annotations

import json
import time
from typing import Iterable, Sequence

from .._testhooks import crash_point
from ..errors import redact
from ..store.pg_pool import advisory_key, pool
from ..store.pg_schema import upgrade
from .jobstore import StoredResult, Unit


class PostgresJobStore:
    """The job state in the PostgreSQL catalog at ``url``. One connection per instance, lent by the
    process's pool (:mod:`pipeline.store.pg_pool`) until :meth:`close`; not shared between threads."""

    def __init__(self, url: str):
        self._url = url
        self.path = redact(url)  # what messages name
        self._pool = pool(url)
        self.conn = self._pool.acquire()
        try:
            upgrade(self.conn, where=self.path)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give the connection back to the pool (once)."""
        pool_, self._pool = self._pool, None
        if pool_ is not None:
            pool_.release(self.conn)

    def __enter__(self) -> "PostgresJobStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reopen(self) -> "PostgresJobStore":
        return PostgresJobStore(self._url)

    def _one(self, sql: str, args=()) -> tuple | None:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone() if cur.description else None

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

    def commit_units(self, units: Sequence[tuple[Unit, str, str, str]]) -> None:
        now = time.time()
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO units VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE"
                " SET text = excluded.text, prompt_tokens = excluded.prompt_tokens,"
                " prefill_tokens = excluded.prefill_tokens, decode_tokens = excluded.decode_tokens,"
                " seconds = excluded.seconds, finished_at = excluded.finished_at",
                [(u.key, dk, pk, u.kind, idx, u.text.replace("\x00", " "), u.prompt_tokens, u.prefill_tokens,
                  u.decode_tokens, u.seconds, now) for u, dk, pk, idx in units])
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
            cur.execute("DELETE FROM claims WHERE job_id = %s", (job_id,))
            for doc_key, prompt_key in pairs:
                for table in ("units", "results"):
                    cur.execute(f"DELETE FROM {table} WHERE doc_key = %s AND prompt_key = %s", (doc_key, prompt_key))
                    n += cur.rowcount
        return n

    # -- claims: several workers on one job -----------------------------------------------------

    def claim(self, job_id: str, items: Sequence[str], *, worker: str, lease: float) -> str | None:
        now = time.time()
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("job", job_id),))  # one claimer per job at a time
            cur.execute("SELECT item, done, lease_until, attempts FROM claims WHERE job_id = %s", (job_id,))
            held = {row[0]: row[1:] for row in cur.fetchall()}
            for item in items:
                done, lease_until, attempts = held.get(item, (0, 0.0, 0))
                if done or lease_until > now:
                    continue
                cur.execute("INSERT INTO claims VALUES (%s, %s, %s, %s, 0, %s) ON CONFLICT (job_id, item) DO UPDATE"
                            " SET worker = excluded.worker, lease_until = excluded.lease_until, done = 0,"
                            " attempts = excluded.attempts", (job_id, item, worker, now + lease, attempts + 1))
                return item
        return None

    def renew(self, job_id: str, item: str, *, worker: str, lease: float) -> bool:
        with self.conn.cursor() as cur:
            cur.execute("UPDATE claims SET lease_until = %s WHERE job_id = %s AND item = %s AND worker = %s"
                        " AND done = 0", (time.time() + lease, job_id, item, worker))
            return cur.rowcount == 1

    def release(self, job_id: str, item: str, *, worker: str, done: bool) -> None:
        if done:
            self._one("UPDATE claims SET done = 1 WHERE job_id = %s AND item = %s AND worker = %s",
                      (job_id, item, worker))
        else:
            self._one("UPDATE claims SET lease_until = 0 WHERE job_id = %s AND item = %s AND worker = %s"
                      " AND done = 0", (job_id, item, worker))

    def claims(self, job_id: str) -> dict[str, dict]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT item, worker, done, attempts, lease_until FROM claims WHERE job_id = %s", (job_id,))
            return {row[0]: {"worker": row[1], "done": bool(row[2]), "attempts": row[3], "lease_until": row[4]}
                    for row in cur.fetchall()}

    def clear_finished_claims(self, job_id: str) -> None:
        self._one("DELETE FROM claims WHERE job_id = %s AND done = 1", (job_id,))

    def _committed(self) -> None:
        crash_point("AFTER_COMMITS")
