"""Server benchmark: TTFT of a question whose prefix the generator server already holds, against a cold one.

A real ``python -m llama_cpp.server`` (SmolLM2-135M, 1 thread) serves the generator
(``models.generator = "openai:..."``); the embedder runs here. Each round asks, over one
~1,500-token document: a question about *another* document first (so the server's slot
holds something else), then question A about the document (cold: the whole prompt is
prefilled), then question B about the same document (repeated prefix: only the question
is prefilled). TTFT is the client's, from the request to the first streamed piece;
the server's own count of reused tokens is read from its log (llama_cpp.server's API
reports none). Rounds repeat; medians are compared, in one run.

    .venv/bin/python benchmarks/remote.py [--tokens 1500] [--repeat 3] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cache import build_document  # noqa: E402

from devtools.llama_server import LlamaServer  # noqa: E402
from pipeline import Pipeline  # noqa: E402
from pipeline.models import resolve  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1500, help="document size in generator tokens")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="a 600-token document, one round")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.repeat = 600, 1

    work = Path(tempfile.mkdtemp(prefix="rag-bench-remote-"))
    base = {"store.path": str(work / "store"), "store.collection": "bench", "cache.enabled": False,
            "engine.n_ctx": 4096, "ask.max_tokens": 4}
    try:
        setup = Pipeline.from_config(overrides=base)
        model = resolve(setup.config.models.generator, home=setup.config.home_path)
        doc, other = work / "long.md", work / "other.md"
        n_doc = build_document(doc, args.tokens, setup.engine.count_tokens)
        other.write_text("A short note about the weather in spring: rain, then sun, then more rain.\n")
        setup.ingest([doc, other])
        setup.close()
        runs: dict[str, list] = {"cold": [], "repeated": []}
        with LlamaServer(model, work, alias="smol", n_ctx=4096) as server:
            rag = Pipeline.from_config(overrides={**base, "models.generator": f"openai:{server.url}#smol"})
            try:
                for i in range(args.repeat):
                    rag.ask("What is the weather like?", doc=str(other))  # the slot now holds another prompt
                    for mode, question in (("cold", "Which function saves the state of one sequence?"),
                                           ("repeated", "How is the prefix cache keyed?")):
                        hits_before = len(server.prefix_hits())
                        st = rag.ask(question, doc=str(doc)).stats
                        hits = server.prefix_hits()[hits_before:]
                        runs[mode].append({"ttft": st.ttft_seconds, "prompt_tokens": st.prompt_tokens,
                                           "server_reused_tokens": hits[-1] if hits else 0})
                        print(f"  round {i + 1} {mode:8}: TTFT {st.ttft_seconds:.3f} s, prompt "
                              f"{st.prompt_tokens:,} tokens, the server reused {runs[mode][-1]['server_reused_tokens']:,}",
                              flush=True)
            finally:
                rag.close()
        cold = statistics.median(r["ttft"] for r in runs["cold"])
        warm = statistics.median(r["ttft"] for r in runs["repeated"])
        reused = statistics.median(r["server_reused_tokens"] for r in runs["repeated"])
        ratio = cold / warm
        prompt = runs["cold"][0]["prompt_tokens"]
        print(f"\nprompt {prompt:,} tokens (document {n_doc:,}); SmolLM2-135M Q4_1 on llama_cpp.server, 1 thread")
        print(f"{'':28}{'cold':>10}{'repeated':>10}{'speed-up':>10}")
        print(f"{'TTFT through the server (s)':28}{cold:>10.3f}{warm:>10.3f}{ratio:>9.1f}x")
        print(f"server reused {reused:,.0f} of {prompt:,} prompt tokens on the repeated prefix")
        if args.json:
            from devtools.bench import document, row

            table = [row("prompt_tokens", prompt, "tokens"),
                     row("cold_ttft_seconds", cold, "s"), row("repeated_ttft_seconds", warm, "s"),
                     row("speedup", ratio, "x", ratio=("cold_ttft_seconds", "repeated_ttft_seconds")),
                     row("server_reused_tokens", reused, "tokens")]
            args.json.write_text(json.dumps(document(table, document_tokens=n_doc, runs=runs), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
