"""A deterministic fake engine and catalog for the job logic of ``rag summarize``, with no model: words are
tokens, and a prompt's output names the chunk markers it covered, so the reduce tree can be checked.
Used by the summarize tests and by the shared job store's tests.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import contextmanager
from types import SimpleNamespace

from pipeline.engine.contract import EngineStats, GeneratorBase
from pipeline.records import DocumentRecord, StoredChunk
from pipeline.store import sections as section_rows
from pipeline.summarize.job import Job, Settings
from pipeline.summarize.jobstore import SQLiteJobStore


class FakeEngine(GeneratorBase):
    """Words are tokens. The output of a prompt is the range of chunk markers (C<i>) it covered, padded,
    or GAP if they were not consecutive and in order."""

    namespace = "fake-model"
    settings = SimpleNamespace(n_batch=512, n_ubatch=512)
    bos: list[int] = []

    def __init__(self, n_ctx: int):
        self.n_ctx = n_ctx
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []
        self.prompts: list[str] = []

    def chat(self, system: str, user: str) -> str:
        return f"SYSTEM {system} USER {user} ASSISTANT"

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        out = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.words)
                self.words.append(w)
            out.append(self.vocab[w])
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, prompt, *, max_tokens, **_):
        tokens = prompt.tokens
        text = " ".join(self.words[t] for t in tokens)
        self.prompts.append(text)
        covered, last, in_order = set(), -1, True
        for lo, hi in re.findall(r"\bC(\d+)(?:\.\.C(\d+))?\b", text):  # in the order the prompt shows them
            in_order = in_order and int(lo) > last
            last = int(hi or lo)
            covered.update(range(int(lo), last + 1))
        contiguous = in_order and covered == set(range(min(covered), max(covered) + 1)) if covered else False
        out = (f"C{min(covered)}..C{max(covered)}" if contiguous else "GAP") + " pad" * (max_tokens - 1)
        stats = EngineStats(prompt_tokens=len(tokens), prefill_tokens=len(tokens), decode_tokens=max_tokens)
        return SimpleNamespace(read=lambda: out, stats=stats)


class FakeMultiEngine(FakeEngine):
    """A fake that decodes several prompts over one prefix together (as ``engine.n_seq_max`` > 1 does)."""

    n_seq_max = 4

    def __init__(self, n_ctx: int):
        super().__init__(n_ctx)
        self.together: list[int] = []  # prompts per generate_many call

    def generate_many(self, prompts, *, max_tokens, **_):
        prefix = prompts[0].prefix
        assert prefix and all(p.tokens[:len(prefix)] == prefix for p in prompts)
        self.together.append(len(prompts))
        return [SimpleNamespace(text=(g := self.generate(p, max_tokens=max_tokens)).read(), stats=g.stats)
                for p in prompts]


class FakeCatalog:
    def __init__(self, docs: dict[str, list[str]]):
        self.docs = {s: DocumentRecord(s, f"h-{hash(tuple(t)) & 0xffff}", 0, 0, "text", n_tokens=10 * len(t),
                                       n_chunks=len(t)) for s, t in docs.items()}
        self.texts = docs
        self.db = sqlite3.connect(":memory:", isolation_level=None)  # sections are cut on first use and recorded here, as in a catalog
        self.db.executescript(section_rows.SCHEMA + "CREATE TABLE documents (collection, source, content_hash);")
        self.db.executemany("INSERT INTO documents VALUES ('c', ?, ?)", [(d.source, d.content_hash)
                                                                          for d in self.docs.values()])

    def document(self, collection, source):
        return self.docs.get(source)

    def sections(self, collection, documents):  # the catalog interface packing reads sections through
        return section_rows.read(self.db, collection, documents)

    def backfill_sections(self, collection, sections):
        return section_rows.backfill(self.db, collection, sections)

    def chunks(self, collection, source, *, first=None, last=None):
        out, start = [], 0
        for i, t in enumerate(self.texts[source]):  # no overlaps: offsets follow each other
            out.append(StoredChunk(f"{source}-{i}", source, self.docs[source].content_hash, i, None, start,
                                   start + len(t), len(t.split()), t))
            start += len(t) + 1
        return [c for c in out if (first is None or c.index >= first) and (last is None or c.index <= last)]


def doc_chunks(n: int, words: int = 20) -> list[str]:
    return [f"C{i} " + " ".join(f"w{i}x{j}" for j in range(words)) + "." for i in range(n)]


def fake_job(tmp_path, docs: dict[str, list[str]], *, n_ctx: int, prompts=("Summarise.",), max_tokens: int = 8,
             engine: FakeEngine | None = None, section_target: int | None = None, reserve: int = 0):
    catalog = FakeCatalog(docs)
    store = SimpleNamespace(name="c", catalog=catalog, documents=lambda: dict(catalog.docs))

    @contextmanager
    def open_store():
        yield store

    engine = engine or FakeEngine(n_ctx)
    jobs = SQLiteJobStore(tmp_path / "jobs.sqlite")
    settings = Settings(max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0, seed=0, system="Be brief.",
                        reserve=reserve)
    job = Job(engine=engine, jobs=jobs, open_store=open_store, collection="c", documents=list(catalog.docs.values()),
              prompts=list(prompts), settings=settings, section_target=section_target or n_ctx // 4)
    return job, jobs, engine
