"""Corpora for the composition benchmarks: real manuals from Debian's documentation packages, and a generated long manual.

Real PDFs: ``gnuplot.pdf`` (gnuplot-doc, 311 pages) and ``asymptote.pdf`` (asymptote-doc),
fetched with ``apt-get download`` and unpacked with ``dpkg -x`` (no install) into a cache
folder. Only these two packages are ever fetched: the other Debian documentation packages
are kept back for independent checks.

The generated manual is deterministic: pages of a made-up irrigation controller's field
manual, each about one numbered unit with values found nowhere else, so a question has
one page that answers it.

Questions were written before any measurement, with the word that finds their page
(``keyword``): the page of the document where it occurs most, a stand-in for retrieval
that does not depend on the embedder.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ALLOWED = {"gnuplot-doc": "usr/share/doc/gnuplot/gnuplot.pdf",
           "asymptote-doc": "usr/share/doc/asymptote/asymptote.pdf"}
"""The only Debian packages fetched, and the manual each holds."""


def cache_dir() -> Path:
    return Path(os.environ.get("RAG_BENCH_CACHE", Path.home() / ".cache" / "rag" / "bench")).expanduser()


def debian_pdf(package: str, *, cache: Path | None = None) -> Path:
    """The manual of ``package`` (one of :data:`ALLOWED`), downloaded and unpacked once into ``cache``."""
    if package not in ALLOWED:
        raise SystemExit(f"{package} is not fetched by these benchmarks (only {', '.join(ALLOWED)})")
    root = (cache or cache_dir()) / "debian" / package
    pdf = root / ALLOWED[package]
    if pdf.exists():
        return pdf
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rag-deb-") as tmp:
        try:
            subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True, text=True)
            deb = next(Path(tmp).glob(f"{package}_*.deb"))
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError, StopIteration) as exc:
            shutil.rmtree(root, ignore_errors=True)
            detail = getattr(exc, "stderr", "") or exc
            raise SystemExit(f"could not fetch {package} with apt-get download: {detail}") from None
    if not pdf.exists():
        raise SystemExit(f"{package} holds no {ALLOWED[package]}")
    return pdf


def pdf_pages(path: Path) -> list[tuple[int, str]]:
    """(page number, text) of every page with text, through the product's own PDF loader (kept
    beside the PDF once read: a 300-page manual takes a while)."""
    import json

    from pipeline.ingest.loaders import load

    kept = path.with_name(path.name + ".pages.json")
    if kept.exists() and kept.stat().st_mtime >= path.stat().st_mtime:
        return [tuple(p) for p in json.loads(kept.read_text())]
    doc = load(path)
    pages = [(u.page, u.text) for u in doc.units if u.text.strip()]
    kept.write_text(json.dumps(pages))
    return pages


# --------------------------------------------------------------------------- the generated manual

_AREAS = ["north orchard", "south vineyard", "greenhouse row", "east pasture", "nursery beds", "west terraces",
          "herb garden", "olive grove", "seed plots", "river meadow", "hop yard", "berry tunnels"]
_PARTS = ["valve group", "pump", "filter", "dosing unit", "pressure sensor", "flow meter", "relay board",
          "moisture probe"]
_TOPICS = [("opening pressure", "kPa"), ("flow limit", "litres per minute"), ("service interval", "days"),
           ("alarm threshold", "percent"), ("warm-up time", "seconds"), ("fuse rating", "amperes")]


@dataclass(frozen=True)
class Question:
    text: str
    keyword: str
    answer: str = ""  # where known (the generated manual): a string the right answer contains


def manual_pages(n_pages: int = 120, *, seed: int = 22, questions: int = 12
                 ) -> tuple[list[tuple[int, str]], list[Question]]:
    """(pages, questions) of the generated field manual: one unit per page, its values stated once;
    ``questions`` of them spread evenly over the pages, each asking for one value."""
    rng = random.Random(seed)
    pages, facts = [], []
    for p in range(1, n_pages + 1):
        part, area = _PARTS[p % len(_PARTS)], _AREAS[(p * 7) % len(_AREAS)]
        unit = f"{part.split()[0][:1].upper()}{part.split()[-1][:1].upper()}-{100 + p}"
        lines = [f"Chapter {1 + (p - 1) // 10}, unit {unit}: the {part} of the {area}", ""]
        values = {}
        for topic, measure in rng.sample(_TOPICS, 4):
            value = rng.randint(3, 900)
            values[topic] = (value, measure)
            lines.append(f"The {topic} of {unit} is {value} {measure}. "
                         f"{rng.choice(_FILLER).format(unit=unit, area=area, part=part)}")
        lines.append(f"When {unit} reports a fault, the controller closes the {area} circuit and "
                     f"logs code {unit}-{rng.randint(10, 99)}; clear it from the service menu after the repair.")
        for _ in range(3):
            lines.append(rng.choice(_FILLER).format(unit=unit, area=area, part=part))
        pages.append((p, "\n".join(lines)))
        topic = rng.choice(sorted(values))
        facts.append(Question(f"What is the {topic} of {unit}?", unit, str(values[topic][0])))
    step = max(1, len(facts) // questions)
    return pages, facts[3::step][:questions]


_FILLER = [
    "Inspect the {part} of the {area} at the start of each season and record the reading in the log book.",
    "The {part} {unit} shares its supply line with the neighbouring units, so isolate the line before work.",
    "A blinking amber light on {unit} means the controller has lost contact with it for more than a minute.",
    "Never run the {area} circuit dry: the {part} loses its prime and must be bled by hand.",
    "Replacement parts for {unit} are listed in the appendix under the {area} heading.",
    "During frost the {part} of the {area} drains itself; do not override the drain valve.",
    "The maintenance crew signs the inspection sheet of {unit} after every test run.",
    "If the readings of {unit} drift, recalibrate the {part} with the handheld tool before replacing it.",
]

# --------------------------------------------------------------------------- the development set's manual


def devset_shelf(n: int = 48) -> tuple[list[tuple[int, str]], list[Question]]:
    """The development set's documents (``samples/`` and ``benchmarks/eval/generated/``) as one run of
    pages, in file order, and up to ``n`` of its questions with a known answer string that occurs in
    them (``benchmarks/eval/devset.jsonl``), spread over the documents."""
    import json

    from pipeline.ingest.loaders import load

    root = Path(__file__).resolve().parent.parent
    eval_dir = root / "benchmarks" / "eval"
    rows = [json.loads(line) for line in (eval_dir / "devset.jsonl").read_text().splitlines() if line.strip()]
    pages: list[tuple[int, str]] = []
    for source in sorted({r["source"] for r in rows}):
        path = root / source if (root / source).exists() else eval_dir / source
        pages += [(len(pages) + 1, u.text) for u in load(path).units if u.text.strip()]
    text = "\n".join(t for _, t in pages)
    qs = [Question(r["question"], r["answer"], r["answer"]) for r in rows if r.get("answer") and r["answer"] in text]
    step = max(1, len(qs) // n)
    return pages, qs[::step][:n]


# --------------------------------------------------------------------------- questions on the real manuals

GNUPLOT = [
    Question("How do I set the range of the x axis?", "xrange"),
    Question("Which command writes the current settings to a file?", "save"),
    Question("How do I plot columns 1 and 3 of a data file?", "using"),
    Question("What does set logscale do?", "logscale"),
    Question("How do I make gnuplot write a PNG image?", "png"),
    Question("What does the fit command do?", "fit"),
    Question("How do I change the number of samples used to plot a function?", "samples"),
    Question("How do I put a title above the plot?", "title"),
    Question("How are the tick marks on an axis controlled?", "tics"),
    Question("How do I draw an arrow on the plot?", "arrow"),
    Question("What does the multiplot mode do?", "multiplot"),
    Question("How do I plot a surface with splot?", "splot"),
]

ASYMPTOTE = [
    Question("How do I draw a line between two points?", "draw"),
    Question("How do I put a label at a point?", "label"),
    Question("What does the unitsize command set?", "unitsize"),
    Question("How do I fill a closed path with a colour?", "fill"),
    Question("What is a pen in Asymptote?", "pen"),
    Question("How do I import a module?", "import"),
    Question("How do I draw axes on a graph?", "axes"),
    Question("What does the size command do?", "size"),
]
