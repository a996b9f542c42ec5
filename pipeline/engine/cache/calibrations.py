"""Composition calibrations, kept with the section states they judge: ``calibrations.sqlite`` in the cache directory.

One row per (engine namespace, seams): the model file and every KV-shaping setting are
in the namespace, so a changed model, context or KV type is calibrated anew. A record
measured again (a later prompt) is merged with the one kept, weighed by its tokens. A record
measured another way than calibrations are now (:data:`~..reuse.budget.METHOD`) counts as none:
the next measurement replaces it.
Never raises: a cache that cannot be used keeps the records of this process in memory,
and a damaged file is replaced.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from ..._sqlite import connect, transaction
from ..reuse.budget import Calibration

FILE_NAME = "calibrations.sqlite"


class Calibrations:
    """The calibration records of one cache directory (``directory`` None: this process only)."""

    def __init__(self, directory: str | Path | None):
        self.path = Path(directory) / FILE_NAME if directory is not None else None
        self._memory: dict[tuple[str, str], Calibration] = {}
        self._mu = threading.Lock()

    def _db(self, *, create: bool = True) -> sqlite3.Connection | None:
        if self.path is None or not (create or self.path.exists()):
            return None
        try:
            db = connect(self.path, timeout=10.0)
            db.execute("CREATE TABLE IF NOT EXISTS calibrations (namespace TEXT NOT NULL, seams TEXT NOT NULL, "
                       "record TEXT NOT NULL, PRIMARY KEY (namespace, seams))")
            return db
        except sqlite3.DatabaseError as exc:
            if create and ("not a database" in str(exc) or "malformed" in str(exc)):
                self.path.unlink(missing_ok=True)
                return self._db()
            return None
        except OSError:
            return None

    def get(self, namespace: str, seams: str) -> Calibration | None:
        """The record for a model's namespace and seams, or None where none was measured."""
        with self._mu:
            if (namespace, seams) in self._memory:
                return self._memory[(namespace, seams)]
        db = self._db(create=False)  # a look never creates the file
        if db is None:
            return None
        try:
            row = db.execute("SELECT record FROM calibrations WHERE namespace = ? AND seams = ?",
                             (namespace, seams)).fetchone()
        except sqlite3.Error:
            row = None
        finally:
            db.close()
        record = _record(row[0]) if row else None
        return record if record is not None and record.current else None

    def add(self, record: Calibration) -> Calibration:
        """Keep ``record`` (merged with the one kept for its namespace and seams); the record kept."""
        key = (record.namespace, record.seams)
        db = self._db()
        if db is None:
            with self._mu:
                kept = self._memory.get(key)
                self._memory[key] = kept.merged(record) if kept else record
                return self._memory[key]
        try:
            with transaction(db):
                row = db.execute("SELECT record FROM calibrations WHERE namespace = ? AND seams = ?", key).fetchone()
                kept = _record(row[0]) if row else None
                merged = kept.merged(record) if kept else record
                db.execute("INSERT OR REPLACE INTO calibrations VALUES (?, ?, ?)",
                           (*key, json.dumps(merged.to_dict())))
            return merged
        except sqlite3.Error:
            with self._mu:
                self._memory[key] = record
            return record
        finally:
            db.close()

    def all(self) -> list[Calibration]:
        """Every record kept that is measured the current way, newest first."""
        db = self._db(create=False)
        rows = []
        if db is not None:
            try:
                rows = db.execute("SELECT record FROM calibrations").fetchall()
            except sqlite3.Error:
                rows = []
            finally:
                db.close()
        with self._mu:
            records = {(c.namespace, c.seams): c for c in self._memory.values()}
        for (text,) in rows:
            c = _record(text)
            if c is not None and c.current:
                records.setdefault((c.namespace, c.seams), c)
        return sorted(records.values(), key=lambda c: -c.measured_at)

    def close(self) -> None:
        """Nothing is held open: each call opens and closes its connection."""

    def clear(self) -> None:
        with self._mu:
            self._memory.clear()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _record(text: str) -> Calibration | None:
    try:
        d = json.loads(text)
        return Calibration(d["model"], d["namespace"], d["seams"], kl=float(d["kl"]), top1=float(d["top1"]),
                           tokens=int(d["tokens"]), prompts=int(d.get("prompts", 1)),
                           sections=int(d.get("sections", 0)), measured_at=float(d.get("measured_at", 0.0)),
                           method=int(d.get("method", 1)), kls=tuple(float(k) for k in d.get("kls", ())))
    except (ValueError, KeyError, TypeError):
        return None


__all__ = ["Calibrations", "FILE_NAME"]
