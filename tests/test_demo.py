"""``make demo``'s point holds: a second, different question over samples/ prefills a small part of what
the first one did, because it reuses the first prompt's prefix.

The check is on llama.cpp's own prefilled-token counters (deterministic), never on seconds; the
seconds are printed for whoever reads the test's output.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^question (\d+): ([\d.]+) s to the first token \(([\d,]+) tokens prefilled, "
                     r"([\d,]+) of ([\d,]+) reused\)")


def demo_command() -> list[str]:
    """The ``rag ask`` arguments of the Makefile's demo target, with its questions."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    questions = shlex.split(re.search(r"^DEMO_QUESTIONS = (.+)$", text, re.M).group(1))
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    ask = next(line for line in recipe.splitlines() if ".venv/bin/rag " in line and " ask " in line)
    args = shlex.split(ask.replace("$(DEMO_QUESTIONS)", shlex.join(questions)))[1:]  # without .venv/bin/rag
    if "--config" in args:  # relative to the repository, where make runs
        i = args.index("--config") + 1
        args[i] = str(ROOT / args[i])
    return args


def test_the_demo_asks_two_different_short_questions_with_gemma():
    args = demo_command()
    ask = args.index("ask")
    assert args[ask + 1:ask + 3] == ["--max-tokens", "64"]
    questions = args[ask + 3:]
    assert len(questions) == 2 and questions[0] != questions[1]
    from pipeline.config import load_config

    config = load_config(args[args.index("--config") + 1], environ={})
    assert config.models.generator == "builtin:gemma-3-270m"


@pytest.mark.slow
def test_the_demos_second_question_prefills_at_least_ten_times_fewer_tokens(store_dir, monkeypatch):
    from pipeline.engine import _llama

    first_token_timings = []
    real = _llama.Model.timings

    def spy(self):  # the generator reads llama.cpp's counters at each answer's first token, then at its end
        t = real(self)
        first_token_timings.append(t)
        return t

    monkeypatch.setattr(_llama.Model, "timings", spy)
    runner = CliRunner()
    result = runner.invoke(cli, ["ingest", str(ROOT / "samples")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, demo_command())
    assert result.exit_code == 0, result.output

    summary = [SUMMARY.match(line) for line in result.output.splitlines()[-2:]]
    assert all(summary), result.output[-600:]
    (_, s1, p1, r1, t1), (_, s2, p2, r2, t2) = [m.groups() for m in summary]
    n = lambda text: int(text.replace(",", ""))  # noqa: E731
    print(f"\nfirst question: {s1} s ({p1} tokens prefilled) · second, different question: {s2} s "
          f"({r2} of {t2} reused)")
    # llama.cpp's own count of the prompt tokens each prefill decoded (its n_p_eval at the first token)
    counted = [t.prompt_tokens for t in first_token_timings[0::2]]
    assert len(first_token_timings) == 4 and counted == [n(p1), n(p2)]
    assert counted[0] >= 10 * counted[1], counted
    assert n(r1) == 0 and n(r2) + n(p2) == n(t2) and n(r2) >= 0.9 * n(t2)


@pytest.mark.slow
def test_several_questions_in_one_ask_are_compared_and_json_is_one_object_per_line(store_dir, ingested,
                                                                                   monkeypatch):
    import json

    from pipeline.schemas import validate

    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    questions = ["Where do tomatoes grow best?", "What do tomato plants need?"]
    runner = CliRunner()
    result = runner.invoke(cli, ["ask", *questions, "--max-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["question"] for a in answers] == questions
    for a in answers:
        validate("ask", a)
    assert answers[1]["stats"]["cached_tokens"] > 0.5 * answers[1]["stats"]["prompt_tokens"]

    text = runner.invoke(cli, ["ask", *questions, "--max-tokens", "4"]).output
    assert "Q1: Where do tomatoes grow best?" in text and "Q2: What do tomato plants need?" in text
    assert text.count("Sources:") == 2
    lines = text.splitlines()[-2:]
    assert [SUMMARY.match(line).group(1) for line in lines] == ["1", "2"], lines
    assert "faster than question 1" in lines[1]
