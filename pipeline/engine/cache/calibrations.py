"""Composition calibrations: the record (:class:`Calibration`), and where it is kept with the section states it
judges (``calibrations.sqlite`` in the cache directory), beside the speeds the reuse planner measured on the
same engine namespace (what its predictions run on).

The record lives here, below the reuse planner that decides on it (:mod:`..reuse.budget`), so that the
cache needs nothing of reuse.

One row per (engine namespace, seams): the model file and every KV-shaping setting are
in the namespace, so a changed model, context or KV type is calibrated anew. A record
measured again (a later prompt) is merged with the one kept, weighed by its tokens. A record
measured another way than calibrations are now (:data:`METHOD`) counts as none:
the next measurement replaces it.
Never raises: a cache that cannot be used keeps the records of this process in memory,
and a damaged file is replaced.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..._sqlite import connect, transaction

FILE_NAME = "calibrations.sqlite"

#: How calibrations are measured now. 2: the exact answer compared on is decoded as questions' answers
#: are, with ``ask.repeat_penalty``, over up to 64 positions (1: 32 positions without the penalty,
#: where small models' answers repeat one line and measure composition as closer to exact than it is).
#: A record of another method is measured again.
METHOD = 2


@dataclass(frozen=True)
class Calibration:
    """Composed against exact prefill for a model file, its KV settings and the seams, over several prompts.

    ``kls`` is each prompt's mean KL(exact ‖ composed) in nats per token, over its teacher-forced answer
    tokens; ``kl``, the figure the decision is taken on, is their mean (each prompt weighs the same, so
    one long answer does not decide alone), and ``spread`` their standard deviation. ``top1`` is the share
    of positions whose most likely token is the same, over ``tokens`` positions of ``prompts`` prompts of
    ``sections`` sections in all, measured by ``method`` (:data:`METHOD`).
    """

    model: str  # the model file's name (for people; the namespace keys it)
    namespace: str
    seams: str  # Seams.key
    kl: float
    top1: float
    tokens: int
    prompts: int = 1
    sections: int = 0
    measured_at: float = field(default_factory=time.time)
    method: int = METHOD
    kls: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.kls:  # one measurement (or a record from before per-prompt figures were kept)
            object.__setattr__(self, "kls", (self.kl,))

    @property
    def current(self) -> bool:
        """Whether it was measured the way calibrations are measured now."""
        return self.method == METHOD

    @property
    def complete(self) -> bool:
        """Whether it rests on enough: :data:`MIN_PROMPTS` prompts and :data:`MIN_TOKENS` positions."""
        return self.prompts >= MIN_PROMPTS and self.tokens >= MIN_TOKENS

    @property
    def spread(self) -> float:
        """The standard deviation of the prompts' figures (0 with one prompt)."""
        return statistics.stdev(self.kls) if len(self.kls) > 1 else 0.0

    def allowed(self, budget: float) -> bool:
        return self.kl <= budget

    def merged(self, other: Calibration) -> Calibration:
        """This record and ``other`` (same model and seams) as one: their prompts' figures together, the
        decision on their mean; ``other`` alone where the two were measured differently."""
        if self.tokens + other.tokens == 0 or self.method != other.method:
            return other
        n = self.tokens + other.tokens
        kls = self.kls + other.kls
        return Calibration(self.model, self.namespace, self.seams, kl=statistics.fmean(kls),
                           top1=(self.top1 * self.tokens + other.top1 * other.tokens) / n, tokens=n,
                           prompts=self.prompts + other.prompts, sections=self.sections + other.sections,
                           method=self.method, kls=kls)

    def to_dict(self, *, budget: float | None = None) -> dict:
        d = asdict(self)
        d["kl"], d["top1"] = round(self.kl, 5), round(self.top1, 4)
        d["kls"] = [round(k, 5) for k in self.kls]
        d["kl_spread"] = round(self.spread, 5)
        d["kl_range"] = [round(min(self.kls), 5), round(max(self.kls), 5)]
        if budget is not None:
            d["budget"] = budget
            d["allowed"] = self.allowed(budget)
        return d


#: Calibrations with fewer teacher-forced tokens than this, or fewer prompts than the next, are measured
#: further (after the next exact answer, or by the next warming).
MIN_TOKENS = 32
MIN_PROMPTS = 3


class Calibrations:
    """The calibration records and the planner's speeds of one cache directory (``directory`` None: this
    process only)."""

    def __init__(self, directory: str | Path | None):
        self.path = Path(directory) / FILE_NAME if directory is not None else None
        self._memory: dict[tuple[str, str], Calibration] = {}
        self._speeds: dict[str, dict[str, float]] = {}  # where the file cannot be used
        self._mu = threading.Lock()

    def _db(self, *, create: bool = True) -> sqlite3.Connection | None:
        if self.path is None or not (create or self.path.exists()):
            return None
        try:
            db = connect(self.path, timeout=10.0)
            db.execute("CREATE TABLE IF NOT EXISTS calibrations (namespace TEXT NOT NULL, seams TEXT NOT NULL, "
                       "record TEXT NOT NULL, PRIMARY KEY (namespace, seams))")
            db.execute("CREATE TABLE IF NOT EXISTS speeds (namespace TEXT PRIMARY KEY, figures TEXT NOT NULL)")
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

    def speeds(self, namespace: str) -> dict[str, float]:
        """The speeds kept for an engine namespace (name → figure; empty where none were kept)."""
        with self._mu:
            if namespace in self._speeds:
                return dict(self._speeds[namespace])
        db = self._db(create=False)
        if db is None:
            return {}
        try:
            row = db.execute("SELECT figures FROM speeds WHERE namespace = ?", (namespace,)).fetchone()
            figures = json.loads(row[0]) if row else {}
        except (sqlite3.Error, ValueError):
            figures = {}
        finally:
            db.close()
        return figures if isinstance(figures, dict) else {}

    def keep_speeds(self, namespace: str, figures: dict[str, float]) -> None:
        """Keep ``figures`` as the speeds of ``namespace`` (they replace the ones kept)."""
        db = self._db()
        if db is None:
            with self._mu:
                self._speeds[namespace] = dict(figures)
            return
        try:
            with transaction(db):
                db.execute("INSERT OR REPLACE INTO speeds VALUES (?, ?)", (namespace, json.dumps(figures)))
        except sqlite3.Error:
            with self._mu:
                self._speeds[namespace] = dict(figures)
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
            self._speeds.clear()
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


__all__ = ["Calibration", "Calibrations", "FILE_NAME", "METHOD", "MIN_PROMPTS", "MIN_TOKENS"]
