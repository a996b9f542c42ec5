"""A generated BERT embedder: a random-weight sentence-transformers folder, converted to GGUF by
the product's own converter (:func:`pipeline.engine.gguf.convert.convert_bert`).

The folder's name becomes the GGUF's ``general.name``, so a test can make a model that calls
itself ``e5-small-tiny`` or ``bge-small-en-v1.5-tiny`` and check what the embedder does with it.
Small enough (2 layers, 32 dims, a few hundred words) to build and load in well under a second.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("query passage search document represent this sentence for searching relevant passages "
         "instruct given a web retrieve that answer the of and to in is it what how which when where "
         "giraffes sleep less than two hours day night zebras run fast lions hunt at dusk owls fly "
         "manual page plot axis label color file data line point graph chart figure table value set "
         "get use can do does not with from by on or be are was were has have had one three four five").split()


def _safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def write_bert_folder(folder: Path, *, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0,
                      pooling: str = "mean") -> Path:
    """A sentence-transformers BERT folder with random weights and a small WordPiece vocabulary."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pieces = SPECIALS + sorted(set(WORDS)) + list("abcdefghijklmnopqrstuvwxyz0123456789.,:;?!'\"-") \
        + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"] + ["##ed", "##ing"]
    vocab = list(dict.fromkeys(pieces))  # llama.cpp refuses a vocabulary with a piece twice
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ff, positions = 2 * hidden, 512
    config = {"model_type": "bert", "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "intermediate_size": ff, "max_position_embeddings": positions,
              "vocab_size": len(vocab), "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_cls_token": pooling == "cls"}))

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.2, size=shape).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": w(len(vocab), hidden),
         "embeddings.position_embeddings.weight": w(positions, hidden),
         "embeddings.token_type_embeddings.weight": w(2, hidden),
         "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
         "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            t[p + f"attention.self.{part}.weight"] = w(hidden, hidden)
            t[p + f"attention.self.{part}.bias"] = w(hidden)
        t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"] = w(hidden, hidden), w(hidden)
        t[p + "attention.output.LayerNorm.weight"] = np.ones(hidden, np.float32)
        t[p + "attention.output.LayerNorm.bias"] = np.zeros(hidden, np.float32)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = w(ff, hidden), w(ff)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = w(hidden, ff), w(hidden)
        t[p + "output.LayerNorm.weight"] = np.ones(hidden, np.float32)
        t[p + "output.LayerNorm.bias"] = np.zeros(hidden, np.float32)
    _safetensors(folder / "model.safetensors", t)
    return folder


def write_bert_gguf(path: Path, *, name: str, **options) -> Path:
    """A generated BERT GGUF at ``path`` whose ``general.name`` is ``name``."""
    from pipeline.engine.gguf.convert import convert_bert

    folder = write_bert_folder(path.parent / f"{path.stem}-src" / name, **options)
    return convert_bert(folder, path, dtype="f32")
