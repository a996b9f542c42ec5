"""The BERT → GGUF converter, proved against llama.cpp and an independent NumPy forward pass.

The real all-MiniLM-L6-v2 folder (provisioned by ./setup.sh) is converted once per
module; llama.cpp must then tokenise like the model's own tokenizer and embed like a
plain NumPy implementation of BERT over the very same safetensors weights.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from pipeline.engine.gguf.convert import KEY_SOURCE_SHA256, convert_bert, read_safetensors, source_sha256
from pipeline.errors import ModelError

pytestmark = pytest.mark.slow  # the real default models (see conftest.py)

MODEL_NAME = "all-MiniLM-L6-v2"

SENTENCES = [
    "Hello world, unbelievable!",
    "The quick brown fox jumps over the lazy dog.",
    "In 1905, Albert Einstein published four papers that changed physics: on the photoelectric "
    "effect, Brownian motion, special relativity and mass-energy equivalence.",
    "Café prices rose 12% in Zürich — naïve buyers didn't notice!",
    "def embed(texts): return [model(t) for t in texts]",
]


@pytest.fixture(scope="module")
def model_dir(model_home: Path) -> Path:
    """The sentence-transformers folder ``rag models pull`` unpacked in the model home."""
    folder = model_home / "models" / MODEL_NAME
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"The test model {folder} is absent: run ./setup.sh (or `rag models pull`) to provision it.")
    return folder


@pytest.fixture(scope="module")
def gguf_path(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_bert(model_dir, tmp_path_factory.mktemp("convert") / "minilm.gguf")


@pytest.fixture(scope="module")
def llm(gguf_path: Path):
    from pipeline.engine._llama import load

    model = load(gguf_path, embedding=True, pooling="mean", n_ctx=512, n_batch=512, n_ubatch=512,
                 threads=os.cpu_count() or 1)
    yield model
    model.close()


def embed(llm, text: str) -> np.ndarray:
    return llm.embed_sequences([llm.tokenize(text, add_bos=True)])[0]


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    """A NumPy BERT over the source weights: ids (one list per text) -> unit embeddings."""
    import json

    weights = read_safetensors(model_dir / "model.safetensors")
    config = json.loads((model_dir / "config.json").read_text())
    return lambda batch: bert_reference(weights, config, batch)


# --- an independent BERT forward pass ------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def bert_reference(weights: dict[str, np.ndarray], config: dict, batch: list[list[int]]) -> np.ndarray:
    """Embed padded ``batch`` with BERT + attention-mask-aware mean pooling + L2 norm, in f64."""
    w = {k.removeprefix("bert."): np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    eps, n_heads = config["layer_norm_eps"], config["num_attention_heads"]
    n_seq, n_tok = len(batch), max(map(len, batch))
    ids = np.zeros((n_seq, n_tok), dtype=np.int64)
    mask = np.zeros((n_seq, n_tok))
    for i, seq in enumerate(batch):
        ids[i, : len(seq)], mask[i, : len(seq)] = seq, 1.0

    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n_tok]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    head = x.shape[-1] // n_heads
    key_bias = (1.0 - mask)[:, None, None, :] * -1e9  # padded keys get no attention

    def dense(t: np.ndarray, name: str) -> np.ndarray:
        return t @ w[name + ".weight"].T + w[name + ".bias"]

    def heads(t: np.ndarray) -> np.ndarray:  # (seq, tok, dim) -> (seq, head, tok, head_dim)
        return t.reshape(n_seq, n_tok, n_heads, head).transpose(0, 2, 1, 3)

    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q, k, v = (heads(dense(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + key_bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(0, 2, 1, 3).reshape(n_seq, n_tok, -1)
        x = _layer_norm(x + dense(ctx, p + "attention.output.dense"),
                        w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        hidden = dense(x, p + "intermediate.dense")
        hidden = 0.5 * hidden * (1.0 + _erf(hidden / math.sqrt(2.0)))
        x = _layer_norm(x + dense(hidden, p + "output.dense"),
                        w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)

    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- tests ---------------------------------------------------------------------------


def test_gguf_metadata_and_dtypes(gguf_path: Path, model_dir: Path) -> None:
    reader = gguf.GGUFReader(gguf_path)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "bert"
    assert fields["general.name"].contents() == MODEL_NAME
    assert fields[KEY_SOURCE_SHA256].contents() == source_sha256(model_dir)
    assert fields["bert.attention.causal"].contents() is False
    assert fields["bert.pooling_type"].contents() == gguf.PoolingType.MEAN
    assert fields["bert.context_length"].contents() == 512
    assert fields["tokenizer.ggml.model"].contents() == "bert"
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["position_embd.weight"] == gguf.GGMLQuantizationType.F32
    assert types["token_types.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.attn_output_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.attn_q.bias"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert not [p for p in gguf_path.parent.iterdir() if p.name.endswith(".tmp")]


def test_tokenizer_matches_bert(llm) -> None:
    ids = llm.tokenize("Hello world, unbelievable!", add_bos=True, special=False)
    assert ids == [101, 7592, 2088, 1010, 23653, 999, 102]


def test_embeddings_match_numpy_reference(llm, reference) -> None:
    batch = [llm.tokenize(s, add_bos=True, special=False) for s in SENTENCES]
    expected = reference(batch)  # padded together: exercises the mask-aware pooling
    cosines = []
    for text, ref in zip(SENTENCES, expected):
        got = embed(llm, text)
        assert len(got) == 384
        cosines.append(_cos(got, ref))
    print("cosine(llama.cpp, numpy) per sentence:", [f"{c:.6f}" for c in cosines])
    assert min(cosines) >= 0.99, cosines


def test_paraphrase_closer_than_unrelated(llm) -> None:
    a, b, c = (embed(llm, t) for t in (
        "A man is playing a guitar.",
        "Someone strums a guitar.",
        "The central bank raised interest rates again.",
    ))
    print(f"paraphrase {_cos(a, b):.3f} unrelated {_cos(a, c):.3f}")
    assert _cos(a, b) > _cos(a, c) + 0.2


def test_missing_folder_raises_model_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelError, match=r"does not exist.*setup\.sh"):
        convert_bert(missing, tmp_path / "out.gguf")
    assert not list(tmp_path.iterdir())


def test_incomplete_folder_raises_model_error(tmp_path: Path) -> None:
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelError, match="missing .*model.safetensors"):
        convert_bert(folder, tmp_path / "out.gguf")


def test_interrupted_write_leaves_no_file(model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    def boom(self) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(KeyboardInterrupt):
        convert_bert(model_dir, tmp_path / "out.gguf")
    assert not list(tmp_path.iterdir())
