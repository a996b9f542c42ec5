"""The versioned JSON outputs of ``rag ... --json`` (and of ``rag serve``), as JSON Schemas.

Every object carries ``"schema": SCHEMA``; its other fields are the API object's
``to_dict()`` (``IngestReport``, ``Hit``, ``Answer``, ``CollectionStatus``, the plan
values), so a script reading the CLI and an app using the library see the same
names. A change that removes or renames a field raises ``SCHEMA``; new fields may be
added within a version. ``docs/app.md`` (JSON outputs) describes them for people; tests validate
every output against these.
"""

from __future__ import annotations

from typing import Any

SCHEMA = 1

_num = {"type": "number"}
_int = {"type": "integer"}
_str = {"type": "string"}
_bool = {"type": "boolean"}
_opt_int = {"type": ["integer", "null"]}
_opt_num = {"type": ["number", "null"]}
_opt_str = {"type": ["string", "null"]}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None, *, closed: bool = False) -> dict:
    props = {**required, **(optional or {})}
    out = {"type": "object", "properties": props, "required": sorted(required)}
    if closed:
        out["additionalProperties"] = False
    return out


def _versioned(body: dict) -> dict:
    body = dict(body)
    body["properties"] = {"schema": {"const": SCHEMA}, **body["properties"]}
    body["required"] = ["schema", *body["required"]]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **body}


HIT = _obj({"source": _str, "page": _opt_int, "score": _num, "text": _str,
            "found_by": {"type": "array", "items": {"enum": ["dense", "lexical"]}},
            "chunk_id": _str, "index": _int, "content_hash": _str, "dense_rank": _opt_int,
            "dense_similarity": _opt_num, "lexical_rank": _opt_int, "bm25": _opt_num}, closed=True)

SOURCE = _obj({"n": _int, "source": _str, "pages": {"type": "array", "items": _int}},
              {"chunks": {"type": "array", "items": _int, "minItems": 2, "maxItems": 2},
               "sections": {"type": "array", "items": _int}, "excerpt": _str})

STATS = _obj({k: _num for k in (
    "prompt_tokens", "cached_tokens", "prefill_tokens", "prefill_seconds", "prefill_tokens_per_second",
    "ttft_seconds", "decode_tokens", "decode_seconds", "decode_tokens_per_second", "load_seconds",
    "cache_load_seconds", "states_saved", "cache_save_seconds", "composed_sections", "recomputed_tokens")} | {
        "cache": {"enum": ["none", "memory", "ram", "disk", "composed", "miss", "server"]},
        "notes": {"type": "array", "items": _str}, "sections_lost": {"type": "array", "items": _str},
        "mode": {"enum": ["whole", "sections", "passages"]}, "sections": {"type": "array", "items": {"type": "object"}},
        "reuse_lost": _str} | {
        # the wait a person sees, from the command's start (process), the call or the request to the first text
        "start_to_first_token_seconds": _opt_num, "start_point": {"enum": ["", "process", "import", "call", "request"]}},
    {"plan": {"enum": ["", "exact", "composed"]}, "predicted_seconds": _num, "predicted_exact_seconds": _num})

ERROR = _versioned(_obj({"error": _obj({"message": _str, "type": _str}), "exit_code": _int}))

SCHEMAS: dict[str, dict] = {
    "ingest": _versioned(_obj(
        {"collection": _str, "counts": {"type": "object", "additionalProperties": _int}, "chunks": _int,
         "tokens": _int, "seconds": _num, "embed_seconds": _num, "tokens_per_second": _num,
         "files": {"type": "array", "items": _obj({"path": _str, "status": _str})}},
        {"warm": {"anyOf": [  # --warm (ingest.warm = "on"): what `rag warm` reports
            _obj({"mode": {"enum": ["whole", "sections"]}, "prefixes": {"type": "array", "items": _obj(
                {"prefix": _str, "documents": _int, "sections": _int, "tokens": _int, "outcome": _str},
                {"prefilled": _int, "bytes": _int})}}, {"purpose": _str, "prefilled_tokens": _int,
                                                        "bytes_written": _int}),
            # ingest.warm = "auto": whether section states were saved, why, and what `rag warm --sections` reports
            _obj({"warmed": _bool, "reason": _str},
                 {"sections": _int, "saved": _int, "cached": _int, "tokens": _int, "prefilled_tokens": _int,
                  "bytes_written": _int, "seconds": _num, "calibration": {"type": ["object", "null"]},
                  "failed": _bool, "chosen": _int, "left": _int, "left_tokens": _int, "left_reason": _str,
                  "room_bytes": _int, "cancelled": _bool, "interrupted": _bool})]}})),
    "search": _versioned(_obj({"query": _str, "hits": {"type": "array", "items": HIT}}, closed=True)),
    "ask": _versioned(_obj(
        {"question": _str, "text": _str, "sources": {"type": "array", "items": SOURCE}, "stats": STATS,
         "dropped_passages": _int, "truncated": _bool, "notes": {"type": "array", "items": _str},
         "retrieval_seconds": {"type": "object", "additionalProperties": _num}}, closed=True)),
    "status": _versioned(_obj(
        {"collection": _str, "store": _str, "exists": _bool, "documents": _int, "chunks": _int, "tokens": _int,
         "dense_chunks": _int, "embedder": _opt_str, "dim": _opt_int, "chunk_size": _opt_int,
         "chunk_overlap": _opt_int, "collections": {"type": "array", "items": _str}, "generator": _opt_str,
         "sources": {"type": "array", "items": _obj({"source": _str, "chunks": _int, "tokens": _int})}},
        {"composition": _obj({"mode": {"enum": ["auto", "on", "off"]}, "model": _opt_str, "seams": _str,
                              "kl": _opt_num, "top1": _opt_num, "tokens": _int, "prompts": _int, "budget": _num,
                              "allowed": _bool}, {"measured_at": _num, "method": _int, "reason": _str,
                                                  "kls": {"type": "array", "items": _num}, "kl_spread": _num,
                                                  "kl_range": {"type": "array", "items": _num}}),
         "system": _obj({"rag": _str, "python": _str, "llama_cpp": _obj({"llama_cpp_python": _str,
                                                                         "system_info": _str}),
                         "models": {"type": "object"}, "cache": _obj({"enabled": _bool})})},
        closed=True)),
    "plan": _versioned(_obj(
        {"plan": _obj({"fits": _bool, "plan": {"type": "object"}, "prefill": {"type": "object"},
                       "memory": {"type": "object"}}),
         "llama_cpp_fit": {"type": ["object", "null"]}, "hardware": {"type": "object"}},
        {"compare": {"type": "array", "items": {"type": "object"}}})),
    "summarize": _versioned(_obj(
        {"job_id": _str, "collection": _str, "documents": _int, "prompts": _int,
         "summaries": {"type": "array", "items": _obj({"source": _str, "prompt": _str, "method": _str,
                                                       "summary": _opt_str, "error": _opt_str})},
         "failed": {"type": "array", "items": _obj({"source": _str, "error": _str})},
         "skipped": {"type": "array", "items": _obj({"source": _str, "error": _str})},
         "prefill_tokens": _int, "cached_tokens": _int, "decode_tokens": _int, "seconds": _num})),
    "sections": _versioned(_obj(
        {"collection": _str, "target": _int, "documents": _int, "sections": _int, "uncut": _int, "stale": _int,
         "recut": _int, "by_target": {"type": "array", "items": _obj(
             {"target": _int, "documents": _int, "sections": _int}, closed=True)}}, closed=True)),
    "error": ERROR,
}


def versioned(data: dict) -> dict:
    """``data`` with the schema version first."""
    return {"schema": SCHEMA, **data}


def validate(kind: str, data: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``data`` is a valid ``kind`` output (for tests)."""
    import jsonschema

    jsonschema.validate(data, SCHEMAS[kind])
