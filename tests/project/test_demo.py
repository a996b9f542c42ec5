"""``make demo``'s point holds: ``rag ingest`` calibrates composition on samples/ (larger than the
context) for the model that answers and says what that decides; the demo's two different questions
then follow that decision: composed from the section states the ingest saved where the calibration
allows, else the first is prefilled exactly and the second, packed from the same sections, reuses it.
Either way the second question prefills a small part of its prompt.

Which way it goes is the model's measurement on this CPU, not the test's choice: the test checks that
the questions follow it. The check is on llama.cpp's own prefilled-token counters (deterministic),
never on seconds; the seconds are printed for whoever reads the test's output.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"^question (\d+): ([\d.]+) s to the first token \(([\d,]+) tokens prefilled, "
                     r"([\d,]+) of ([\d,]+) reused\)")


def demo_command(command: str = "ask") -> list[str]:
    """The ``rag ask`` (or ``rag ingest``) arguments of the Makefile's demo target, with its questions."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    questions = shlex.split(re.search(r"^DEMO_QUESTIONS = (.+)$", text, re.M).group(1))
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    ask = next(line for line in recipe.splitlines() if ".venv/bin/rag " in line and f" {command} " in line)
    args = shlex.split(ask.replace("$(DEMO_QUESTIONS)", shlex.join(questions)))[1:]  # without .venv/bin/rag
    if command == "ingest":
        args = [str(ROOT / a) if a == "samples/" else a for a in args]
    if "--config" in args:  # relative to the repository, where make runs
        i = args.index("--config") + 1
        args[i] = str(ROOT / args[i])
    return args


def test_the_demo_asks_two_different_short_questions_with_the_defaults():
    args = demo_command()
    assert args[0] == "ask" and "--config" not in args  # what a new user gets
    assert args[1:3] == ["--max-tokens", "64"]
    questions = args[3:]
    assert len(questions) == 2 and questions[0] != questions[1]
    from pipeline.config import load_config

    assert load_config(None, environ={}).models.generator == "builtin:gemma-3-270m"


def test_the_demo_ingests_for_the_model_that_answers():
    ingest, ask = demo_command("ingest"), demo_command()
    assert ingest[:ingest.index("ingest")] == ask[:ask.index("ask")]  # the same --config
    assert ingest[ingest.index("ingest") + 1:] == [str(ROOT / "samples/")]


@pytest.mark.slow
def test_the_demos_questions_follow_the_calibration_its_ingest_made(store_dir, monkeypatch):
    from pipeline.engine import _llama

    monkeypatch.delenv("RAG_INGEST_WARM")  # the default, as `make demo` runs it
    first_token_timings = []
    real = _llama.Model.timings

    def spy(self):  # the generator reads llama.cpp's counters at each answer's first token, then at its end
        t = real(self)
        first_token_timings.append(t)
        return t

    runner = CliRunner()
    result = runner.invoke(cli, demo_command("ingest"))
    assert result.exit_code == 0, result.output
    verdict = re.search(r"^composition calibrated: mean KL ([\d.]+) nats \(spread [\d.]+ over 3 prompts\), "
                        r"budget 0\.05, top-1 [\d.]+% over "
                        r"\d+ tokens: (questions are composed|over ask.compose_max_kl: questions stay exact)$",
                        result.output, re.M)
    assert verdict, result.output
    composed = verdict.group(2) == "questions are composed"
    assert composed == (float(verdict.group(1)) <= 0.05)
    assert ("sections of 4 documents" in result.output) == composed  # the states are saved only where used
    args = demo_command()
    status = runner.invoke(cli, [*args[:args.index("ask")], "status", "--json"])
    assert status.exit_code == 0 and json.loads(status.output)["composition"]["allowed"] == composed

    monkeypatch.setattr(_llama.Model, "timings", spy)
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = [SUMMARY.match(line) for line in result.output.splitlines()[-2:]]
    assert all(summary), result.output[-600:]
    (_, s1, p1, r1, t1), (_, s2, p2, r2, t2) = [m.groups() for m in summary]
    n = lambda text: int(text.replace(",", ""))  # noqa: E731
    print(f"\ncalibration: KL {verdict.group(1)}, {'composed' if composed else 'exact'} · first question: {s1} s "
          f"({p1} of {t1} tokens prefilled) · second, different question: {s2} s ({p2} of {t2} prefilled)")
    # llama.cpp's own count of the prompt tokens each prefill decoded (its n_p_eval at the first token)
    counted = [t.prompt_tokens for t in first_token_timings[0::2]]
    assert len(first_token_timings) == 4 and counted == [n(p1), n(p2)]
    assert n(t1) > 4000 and n(t2) > 4000
    # Composed, the first question too prefills only seams and itself; exact, it prefills its sections.
    assert (10 * n(p1) <= n(t1)) == composed
    assert 10 * n(p2) <= n(t2) and n(r2) >= 0.9 * n(t2)
