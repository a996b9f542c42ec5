"""Bytes per token and tokens per GB of section states, for the shapes users run, from GGUF metadata.

Sizes come from :meth:`pipeline.engine.gguf.info.ModelInfo.state_bytes` with the KV types
:func:`pipeline.engine.cache.sections.kept_types` keeps a state in (an engine with an f16 KV cache and
flash attention, the defaults), the code that sizes what the cache writes and what warming chooses
within its room (:meth:`pipeline.engine.local.Engine.section_state_bytes`; checked against real state files of SmolLM2, Gemma 3 and a generated gpt-oss in
``tests/cache/test_state_storage.py``): per section of N tokens, the token list, every full-attention
layer's keys and values for each token, and a sliding-window layer's for the last ``window``
tokens only. The published shapes are written as the GGUF metadata llama.cpp's converter writes for
them (architecture, layers, KV heads, head sizes, windows); ``--gguf`` reads real files instead.
A hybrid model (recurrent Gated DeltaNet layers) keeps no section states: its prompts are reused as
exact prefixes only.

    .venv/bin/python benchmarks/state_footprint.py [--section-tokens 512,2048] [--gguf MODEL.gguf ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.engine.cache.sections import kept_types  # noqa: E402
from pipeline.engine.gguf.info import ModelInfo  # noqa: E402

GB = 1e9

#: GGUF metadata of published models, as llama.cpp's converter writes it (the keys that shape the KV cache).
PUBLISHED: dict[str, dict] = {
    "Llama 3.1 8B (dense)": {
        "general.architecture": "llama", "llama.block_count": 32, "llama.embedding_length": 4096,
        "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8, "llama.context_length": 131072},
    "Qwen3-30B-A3B (MoE)": {
        "general.architecture": "qwen3moe", "qwen3moe.block_count": 48, "qwen3moe.embedding_length": 2048,
        "qwen3moe.attention.head_count": 32, "qwen3moe.attention.head_count_kv": 4,
        "qwen3moe.attention.key_length": 128, "qwen3moe.attention.value_length": 128,
        "qwen3moe.context_length": 40960, "qwen3moe.expert_count": 128, "qwen3moe.expert_used_count": 8},
    "gpt-oss-20b (MoE, 128-token windows)": {
        "general.architecture": "gpt-oss", "gpt-oss.block_count": 24, "gpt-oss.embedding_length": 2880,
        "gpt-oss.attention.head_count": 64, "gpt-oss.attention.head_count_kv": 8,
        "gpt-oss.attention.key_length": 64, "gpt-oss.attention.value_length": 64,
        "gpt-oss.attention.sliding_window": 128, "gpt-oss.context_length": 131072,
        "gpt-oss.expert_count": 32, "gpt-oss.expert_used_count": 4},
    "Qwen3.6-35B-A3B (hybrid)": {
        "general.architecture": "qwen35moe", "qwen35moe.block_count": 40, "qwen35moe.embedding_length": 2048,
        "qwen35moe.attention.head_count": 16, "qwen35moe.attention.head_count_kv": 2,
        "qwen35moe.attention.key_length": 256, "qwen35moe.attention.value_length": 256,
        "qwen35moe.full_attention_interval": 4, "qwen35moe.context_length": 262144,
        "qwen35moe.expert_count": 256, "qwen35moe.expert_used_count": 8},
}
#: The bundled models, read from their files where they are present.
LOCAL = {"SmolLM2-135M": "builtin:SmolLM2-135M-Instruct", "Gemma 3 270M (512-token windows)": "builtin:gemma-3-270m"}


def layers(info: ModelInfo) -> str:
    kinds = [lay.kind for lay in info.layers]
    parts = [f"{kinds.count(k)} {name}" for k, name in (("full", "full"), ("swa", "window"), ("recurrent", "recurrent"))
             if kinds.count(k)]
    return ", ".join(parts)


def row(name: str, info: ModelInfo, n: int) -> dict:
    out = {"model": name, "layers": layers(info), "section_tokens": n}
    if any(lay.kind == "recurrent" for lay in info.layers):
        return {**out, "composes": False}
    for section_type in ("f16", "q8_0"):  # cache.section_type, on an engine running an f16 KV cache
        per_token = info.state_bytes(n, *kept_types(section_type, "f16", "f16")) / n
        out[section_type] = {"bytes_per_token": per_token, "tokens_per_gb": GB / per_token}
    return {**out, "composes": True}


def models(ggufs: list[Path]) -> list[tuple[str, ModelInfo]]:
    out = [(name, ModelInfo.from_metadata(meta, [], name=name)) for name, meta in PUBLISHED.items()]
    try:
        from pipeline.config import resolve_home
        from pipeline.models import resolve

        for name, ref in LOCAL.items():
            try:
                out.append((name, ModelInfo.read(resolve(ref, home=resolve_home(), fetch=False))))
            except Exception:  # not provisioned here: the published rows still print
                pass
    except ImportError:
        pass
    return out + [(p.name, ModelInfo.read(p)) for p in ggufs]


def print_table(rows: list[dict], n: int) -> None:
    print(f"\nSection states of {n:,} tokens (bytes per token of the state file; GB = 10^9 bytes)")
    print("| model | attention layers | f16: bytes per token | f16: tokens per GB | q8_0: bytes per token "
          "| q8_0: tokens per GB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if not r["composes"]:
            print(f"| {r['model']} | {r['layers']} | none: exact reuse only | | | |")
            continue
        f, q = r["f16"], r["q8_0"]
        print(f"| {r['model']} | {r['layers']} | {f['bytes_per_token']:,.0f} | {f['tokens_per_gb']:,.0f} | "
              f"{q['bytes_per_token']:,.0f} | {q['tokens_per_gb']:,.0f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--section-tokens", default="512,2048", help="section sizes, comma-separated")
    ap.add_argument("--gguf", type=Path, nargs="*", default=[], help="GGUF files to add (their metadata only)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="the same (it reads metadata only)")
    args = ap.parse_args(argv)
    found = models(args.gguf)
    everything = []
    for n in (int(x) for x in args.section_tokens.split(",")):
        rows = [row(name, info, n) for name, info in found]
        print_table(rows, n)
        everything += rows
    if args.json:
        from devtools.bench import document, row as bench_row

        points = [bench_row(f"{r['model']} {r['section_tokens']} {kv}", r[kv]["bytes_per_token"], "bytes/token",
                            series=kv) for r in everything if r["composes"] for kv in ("f16", "q8_0")]
        args.json.write_text(json.dumps(document(points, rows=everything), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
