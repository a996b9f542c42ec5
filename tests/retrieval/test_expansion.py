"""HyDE and doc2query (both off by default), with a scripted generator: what reaches the index and the query.

The generator fake answers from a script, so each test knows what the "real generator" wrote;
the embedder is the word-hashing fake, which cannot bridge a paraphrase on its own.
"""

from __future__ import annotations

from pathlib import Path

from support.fakes import EchoGenerator, HashEmbedder
from pipeline.engine.contract import Generation
from pipeline.ingest.doc2query import questions_for
from pipeline.retrieval.expansion import hyde_query


class ScriptedGenerator(EchoGenerator):
    """Answers with ``reply(prompt_text)``; remembers every prompt text."""

    def __init__(self, reply, **kwargs):
        super().__init__(**kwargs)
        self.reply = reply
        self.texts: list[str] = []

    def generate(self, tokens, *, max_tokens: int = 256, **kwargs) -> Generation:
        text = self.detokenize(tokens)
        self.texts.append(text)
        stats = super().generate(tokens, max_tokens=max_tokens, **kwargs).stats
        return Generation(iter([self.reply(text)]), stats)


def shelf(folder: Path) -> Path:
    folder.mkdir()
    (folder / "giraffes.md").write_text("# Giraffes\n\nGiraffes sleep less than two hours a day.\n", encoding="utf-8")
    (folder / "rooms.md").write_text("# Rooms\n\nHow long does the meeting last? The room holds ten chairs.\n", encoding="utf-8")
    (folder / "lamps.md").write_text("# Lamps\n\nThe reading lamp takes one bulb of forty watts.\n", encoding="utf-8")
    return folder


QUESTION = "How long does the tallest animal rest?"


def test_hyde_embeds_the_question_with_the_generated_passage(fake_pipeline, tmp_path):
    generator = ScriptedGenerator(lambda text: "Giraffes sleep less than two hours a day.")
    rag = fake_pipeline(generator=generator, retrieval__lexical=False, retrieval__rerank="none")
    rag.ingest([shelf(tmp_path / "docs")])
    assert Path(rag.search(QUESTION, top_k=1)[0].source).name == "rooms.md"  # shares "how long does the"
    assert generator.texts == []  # off by default: no generation

    rag = fake_pipeline(generator=generator, retrieval__lexical=False, retrieval__rerank="none",
                        retrieval__hyde=True)
    timings: dict[str, float] = {}
    hit = rag.search(QUESTION, top_k=1, timings=timings)[0]
    assert Path(hit.source).name == "giraffes.md"
    assert len(generator.texts) == 1 and QUESTION in generator.texts[0]
    assert "hyde" in timings
    expected = rag.embedder.embed([hyde_query(QUESTION, "Giraffes sleep less than two hours a day.")])[0]
    with rag.store(create=False) as store:
        stored = store.vectors([hit.chunk_id])[hit.chunk_id]
    assert abs(hit.dense_similarity - float(stored @ expected)) < 1e-3


def test_doc2query_indexes_generated_questions_with_each_chunk_but_never_shows_them(fake_pipeline, tmp_path):
    def reply(text: str) -> str:
        return "1. How long does the tallest animal rest?\n2) When do giraffes nap?" if "Giraffes" in text else "- ?"

    generator = ScriptedGenerator(reply)
    rag = fake_pipeline(generator=generator, chunking__doc2query=2, retrieval__dense=False)
    rag.ingest([shelf(tmp_path / "docs")])
    assert len(generator.texts) == 3  # one generation per chunk
    with rag.store(create=False) as store:
        row = store.catalog.db.execute("SELECT context, text FROM chunks WHERE source LIKE '%giraffes.md'").fetchone()
    assert row[0].endswith("How long does the tallest animal rest?\nWhen do giraffes nap?")
    assert "tallest" not in row[1]
    hit = rag.search("tallest animal rest", top_k=1)[0]  # BM25 meets the question's words
    assert Path(hit.source).name == "giraffes.md" and "tallest" not in hit.text


def test_questions_are_read_one_per_line_without_numbering():
    generator = ScriptedGenerator(lambda text: "1. What is A?\n\n2) What is B?\n- What is A?\nok\nQ3: Why C then?")
    assert questions_for(generator, "passage", n=5, max_tokens=64) == ["What is A?", "What is B?", "Why C then?"]
    assert questions_for(generator, "passage", n=1, max_tokens=64) == ["What is A?"]
