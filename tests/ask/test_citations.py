"""Sources are numbered from 1 in the order the prompt holds them, and the answer's citations match:
the numbering and the rewriting of citations (:mod:`pipeline.ask.citations`), then answers from a
generator that cites the prompt's numbers, streamed and not, over whole documents and sections."""

from __future__ import annotations

import random
import re

import pytest

from support.fakes import EchoGenerator
from pipeline.ask.citations import Renumbering, numbering, renumber, shown_sources
from pipeline.engine.contract import Generation
from pipeline.records import PromptShape


def test_listed_documents_come_first_in_prompt_order_then_the_others():
    assert numbering([3, 4, 7], [4, 7]) == {4: 1, 7: 2, 3: 3}
    assert numbering([1, 2, 3], [1, 2, 3]) == {1: 1, 2: 2, 3: 3}
    assert numbering([5, 2, 9], [9, 5]) == {5: 1, 9: 2, 2: 3}  # prompt order, not the numbers' order
    assert shown_sources([{"n": 7, "source": "b"}, {"n": 4, "source": "a"}], {4: 1, 7: 2, 3: 3}) == [
        {"n": 1, "source": "a"}, {"n": 2, "source": "b"}]


@pytest.mark.parametrize("text,want", [
    ("Zebras are striped [4].", "Zebras are striped [1]."),
    ("See [4, p. 9] and [7,p.2].", "See [1, p. 9] and [2,p.2]."),
    ("Both [4, 7] agree; [3][4].", "Both [1, 2] agree; [3][1]."),
    ("An index a[4] and [99] stay.", "An index a[4] and [99] stay."),
    ("[4] first, then [4] again", "[1] first, then [1] again"),
    ("A page range [7, pp. 4-9].", "A page range [2, pp. 4-9]."),
    ("Text [ 4 ] and [4 and more]", "Text [ 4 ] and [4 and more]"),
    ("no citation at all", "no citation at all"),
])
def test_citations_are_rewritten_to_the_shown_numbers(text, want):
    assert renumber(text, {4: 1, 7: 2, 3: 3}) == want


def test_a_stream_is_rewritten_exactly_as_the_whole_text_however_it_is_cut():
    shown = {4: 1, 7: 2, 3: 3, 12: 4}
    rng = random.Random(5)
    texts = ["Zebras are striped [4]. Lions [7, p. 3] roar; see [12] and x[4] or [3][4].",
             "[4]", "[4", "ends open [7, p", "[[4]] [1234567] [4,7,3]", "a" * 100 + "[12]" + "b" * 100]
    for text in texts:
        want = renumber(text, shown)
        for _ in range(200):
            k = min(len(text) - 1, rng.randint(0, 8))
            cuts = sorted(rng.sample(range(1, len(text)), k)) if k > 0 else []
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            assert "".join(Renumbering(shown).stream(pieces)) == want, (text, pieces)
    assert list(Renumbering({1: 1, 2: 2}).stream(["a [", "1", "]"])) == ["a [", "1", "]"]  # nothing to do: as is


class Citing(EchoGenerator):
    """Answers "Zebras are striped [N]." citing the number the prompt gives zebra.md, cut inside the citation."""

    def generate(self, prompt, **kw) -> Generation:
        gen = super().generate(prompt, **kw)
        text = self.detokenize(PromptShape.coerce(prompt).tokens)
        n = re.search(r"\[(\d+)\] zebra\.md", text).group(1)
        self.cited = n
        words = ["Zebras", " are striped", " [", n, ", p", "age 1", "]", "."]
        return Generation(self._stream(words, gen.stats, kw.get("cancel")), gen.stats)


DOCS = {"a.md": "# Aardvarks\n\nAardvarks eat ants at night in the savanna.\n",
        "b.md": "# Badgers\n\nBadgers dig setts under hedgerows in the woods.\n",
        "c.md": "# Camels\n\nCamels store fat in their humps for long walks in the desert.\n",
        "zebra.md": "# Zebras\n\nZebras are striped horses of the African plains; each stripe pattern is unique.\n"}


@pytest.mark.parametrize("compose", ["off", "on"])
def test_the_answer_cites_the_numbers_its_sources_show(fake_pipeline, tmp_path, compose):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    generator = Citing()
    rag = fake_pipeline(generator=generator, ask__compose=compose, ask__top_k=2)
    rag.ingest([docs])
    answer = rag.ask("Why are zebras striped?")
    assert generator.cited == "4"  # the prompt holds the documents in order: zebra.md is its fourth
    assert [s["n"] for s in answer.sources] == list(range(1, len(answer.sources) + 1))
    zebra = next(s for s in answer.sources if s["source"].endswith("zebra.md"))
    assert zebra["n"] < 4 and answer.text == f"Zebras are striped [{zebra['n']}, page 1]."
    assert "Zebras are striped horses" in zebra["excerpt"]
    stream = rag.ask_stream("Why are zebras striped?")
    with stream:
        streamed = "".join(stream)
    assert streamed == answer.text and stream.sources == answer.sources
    assert rag.prompt("Why are zebras striped?").citations[4] == zebra["n"]
    only = rag.ask("Why are zebras striped?", top_k=1)  # the best hit's document alone: number 1
    assert [s["source"][-8:] for s in only.sources] == ["zebra.md"] and only.sources[0]["n"] == 1
    assert only.text == "Zebras are striped [1, page 1]."
