"""ggml's tensor types: their names, their sizes in blocks, and the ones llama.cpp takes for a KV cache.

Plain data, no llama.cpp import: the configuration validates KV cache types with
it, the engine sizes its KV cache with it, and the tuner sizes weights and KV
cells with it.
"""

from __future__ import annotations

from ...errors import ConfigError

#: ggml type name -> (block size in values, bytes per block), as ggml defines them.
GGML_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
    "q8_k": (256, 292), "iq4_nl": (32, 18), "iq4_xs": (256, 136),
}
#: ggml_type enum values for the KV cache types llama.cpp accepts (``-ctk``/``-ctv``).
KV_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30, "iq4_nl": 20}


def type_bytes(n_values: int, type_name: str) -> int:
    """Bytes of ``n_values`` values stored as ggml type ``type_name`` (rounded up to whole blocks)."""
    try:
        block, size = GGML_TYPES[type_name.lower()]
    except KeyError:
        raise ConfigError(f"Unknown ggml type {type_name!r}.") from None
    return -(-n_values // block) * size


__all__ = ["GGML_TYPES", "KV_TYPE_IDS", "type_bytes"]
