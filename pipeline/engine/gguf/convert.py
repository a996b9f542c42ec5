"""Convert a sentence-transformers BERT folder into a GGUF that llama.cpp embeds with.

No model hub is reachable at run time and llama.cpp's own ``convert_hf_to_gguf.py``
needs torch and transformers, so the embedder is converted here, with numpy and the
``gguf`` writer only. The result matches what llama.cpp's converter writes for
``BertModel``: architecture ``bert``, a WordPiece vocabulary rewritten to llama.cpp's
"phantom space" form, causal attention off and the pooling of the sentence-transformers
folder. The source's sha256 is recorded in the metadata so a cached GGUF can be checked
against the folder it came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ...errors import ModelError

__all__ = ["convert_bert", "read_safetensors", "source_sha256", "CONVERTER_VERSION"]

#: Bumped whenever the GGUF written for the same source would change.
CONVERTER_VERSION = 1

#: GGUF metadata keys of our own (not read by llama.cpp).
KEY_SOURCE_SHA256 = "rag.source.sha256"
KEY_CONVERTER_VERSION = "rag.converter.version"

_REQUIRED_FILES = ("config.json", "vocab.txt", "model.safetensors", "1_Pooling/config.json")

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}

_PHANTOM_SPACE = "\u2581"
_DEFAULT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


def read_safetensors(path: Path | str) -> dict[str, np.ndarray]:
    """Read every tensor of a ``.safetensors`` file into numpy arrays (BF16 widened to f32).

    The format is an 8-byte little-endian header length, a JSON header mapping names to
    dtype, shape and byte offsets, then the raw little-endian data. The arrays are views
    of a read-only memory map: cheap to open, copied only when converted.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    except (OSError, ValueError) as err:
        raise ModelError(f"Cannot read the safetensors file {path}: {err}.") from err
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], info["shape"]
        start, end = info["data_offsets"]
        raw = data[start:end]
        if dtype == "BF16":
            arr = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _SAFETENSORS_DTYPES:
            arr = raw.view(np.dtype(_SAFETENSORS_DTYPES[dtype]).newbyteorder("<"))
        else:
            raise ModelError(f"Unsupported tensor dtype {dtype} for {name!r} in {path}.")
        tensors[name] = arr.reshape(shape)
    return tensors


def source_sha256(model_dir: Path | str) -> str:
    """The sha256 of the folder's weights, vocabulary and configs, in a fixed order.

    This is what a cached GGUF records; a different value means the cache is stale.
    """
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    for rel in _REQUIRED_FILES:
        digest.update(rel.encode() + b"\0")
        with (model_dir / rel).open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def convert_bert(model_dir: Path, out_path: Path, *, dtype: str = "f16") -> Path:
    """Convert the sentence-transformers BERT folder ``model_dir`` into the GGUF ``out_path``.

    ``dtype`` ("f16" or "f32") applies to the matrix weights only; position and
    token-type embeddings, norms and biases stay f32, because llama.cpp's CPU backend
    aborts on an f16 position or token-type embedding. The file is written next to
    ``out_path`` under a temporary name and renamed into place at the end, so an
    interrupted conversion never leaves a partial GGUF. Returns ``out_path``.

    Raises ModelError when the folder is missing, incomplete or not a BERT model.
    """
    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', not {dtype!r}")
    model_dir, out_path = Path(model_dir).expanduser(), Path(out_path).expanduser()
    config = _check_folder(model_dir)
    tokens, toktypes, special_ids = _vocab(model_dir, config)
    pooling = _pooling(model_dir)
    n_layers = int(config["num_hidden_layers"])
    tensors = _map_tensors(read_safetensors(model_dir / "model.safetensors"), n_layers, dtype)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    writer = None
    try:
        writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
        writer.add_name(model_dir.name)
        writer.add_string(KEY_SOURCE_SHA256, source_sha256(model_dir))
        writer.add_uint32(KEY_CONVERTER_VERSION, CONVERTER_VERSION)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
        writer.add_context_length(int(config["max_position_embeddings"]))
        writer.add_embedding_length(int(config["hidden_size"]))
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_block_count(n_layers)
        writer.add_head_count(int(config["num_attention_heads"]))
        writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
        writer.add_causal_attention(False)
        writer.add_pooling_type(pooling)

        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(toktypes)
        writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
        # As llama.cpp's converter (gguf.SpecialVocab on "[CLS] $A [SEP]"): BOS is [CLS],
        # EOS is [SEP], both added around every input; no extra separator. GGUF has no
        # CLS key: llama.cpp takes [CLS] from the BOS id.
        writer.add_bos_token_id(special_ids["cls"])
        writer.add_eos_token_id(special_ids["sep"])
        writer.add_sep_token_id(special_ids["sep"])
        writer.add_pad_token_id(special_ids["pad"])
        writer.add_unk_token_id(special_ids["unk"])
        if "mask" in special_ids:
            writer.add_mask_token_id(special_ids["mask"])
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(True)
        writer.add_add_sep_token(False)

        for name, array, raw_dtype in tensors:
            writer.add_tensor(name, array, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    except BaseException:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out_path


def _check_folder(model_dir: Path) -> dict[str, Any]:
    """Check the folder holds a BERT sentence-transformers model; return its config.json."""
    if not model_dir.is_dir():
        raise ModelError(f"The embedding model folder {model_dir} does not exist; run ./setup.sh to provision it.")
    missing = [rel for rel in _REQUIRED_FILES if not (model_dir / rel).is_file()]
    if missing:
        raise ModelError(
            f"The embedding model folder {model_dir} is incomplete (missing {', '.join(missing)}); "
            "run ./setup.sh to provision it again."
        )
    config = _read_json(model_dir / "config.json")
    if config.get("model_type") != "bert":
        raise ModelError(
            f"{model_dir} holds a {config.get('model_type')!r} model; only BERT models can be converted."
        )
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings")
    if absent := [key for key in needed if key not in config]:
        raise ModelError(f"{model_dir / 'config.json'} lacks {', '.join(absent)}.")
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"{model_dir} is a BERT variant llama.cpp's 'bert' architecture cannot run.")
    return config


def _read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file, turning any failure into a ModelError."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelError(f"Cannot read {path}: {err}.") from err
    if not isinstance(value, dict):
        raise ModelError(f"{path} is not a JSON object.")
    return value


def _vocab(model_dir: Path, config: dict[str, Any]) -> tuple[list[str], list[int], dict[str, int]]:
    """The WordPiece vocabulary in llama.cpp's form, its token types and the special token ids.

    As in llama.cpp's converter: a continuation piece ``##x`` becomes ``x``, every other
    piece gets a leading U+2581, and special tokens are kept verbatim as control tokens
    (the unknown token is typed UNKNOWN).
    """
    pieces = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    vocab_size = int(config.get("vocab_size", len(pieces)))
    if len(pieces) != vocab_size:
        raise ModelError(f"{model_dir / 'vocab.txt'} has {len(pieces)} tokens; config.json says {vocab_size}.")
    index = {piece: i for i, piece in enumerate(pieces)}

    names = dict(_DEFAULT_SPECIALS)
    extra: set[str] = set()
    for rel in ("special_tokens_map.json", "tokenizer_config.json"):
        if (model_dir / rel).is_file():
            for key, value in _read_json(model_dir / rel).items():
                if isinstance(value, dict):  # {"content": "[CLS]", ...}
                    value = value.get("content")
                if key.endswith("_token") and isinstance(value, str):
                    names[key[: -len("_token")]] = value
    if (model_dir / "tokenizer.json").is_file():
        added = _read_json(model_dir / "tokenizer.json").get("added_tokens") or []
        extra = {t["content"] for t in added if t.get("special")}

    special_ids = {kind: index[name] for kind, name in names.items() if name in index}
    if absent := [k for k in ("cls", "sep", "pad", "unk") if k not in special_ids]:
        raise ModelError(f"{model_dir / 'vocab.txt'} lacks the special tokens {', '.join(absent)}.")
    control = {pieces[i] for i in special_ids.values()} | (extra & index.keys())

    tokens: list[str] = []
    toktypes: list[int] = []
    for i, piece in enumerate(pieces):
        if piece in control:
            tokens.append(piece)
            unknown = i == special_ids["unk"]
            toktypes.append(gguf.TokenType.UNKNOWN if unknown else gguf.TokenType.CONTROL)
        else:
            tokens.append(piece[2:] if piece.startswith("##") else _PHANTOM_SPACE + piece)
            toktypes.append(gguf.TokenType.NORMAL)
    return tokens, toktypes, special_ids


def _pooling(model_dir: Path) -> gguf.PoolingType:
    """The pooling declared by the sentence-transformers folder, as llama.cpp names it."""
    pooling = _read_json(model_dir / "1_Pooling" / "config.json")
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise ModelError(f"{model_dir / '1_Pooling/config.json'} asks for a pooling llama.cpp does not offer.")


# Tensors of the checkpoint that an embedder does not use.
_SKIPPED = re.compile(r"^(embeddings\.position_ids|pooler\..*|cls\..*)$")
# GGUF tensors that must stay f32 whatever the requested dtype.
_F32_ONLY = ("position_embd.weight", "token_types.weight")


def _map_tensors(
    source: dict[str, np.ndarray], n_layers: int, dtype: str
) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
    """Rename the checkpoint's tensors to llama.cpp's BERT names and cast them for writing."""
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    out = []
    for hf_name, array in source.items():
        name = hf_name.removeprefix("bert.")
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        if _SKIPPED.match(name):
            continue
        new_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ModelError(f"Unexpected tensor {hf_name!r} in the checkpoint: not a BERT encoder tensor.")
        keep_f32 = array.ndim <= 1 or new_name.endswith(_F32_ONLY) or dtype == "f32"
        if keep_f32:
            out.append((new_name, np.ascontiguousarray(array, dtype=np.float32), gguf.GGMLQuantizationType.F32))
        else:
            out.append((new_name, np.ascontiguousarray(array, dtype=np.float16), gguf.GGMLQuantizationType.F16))
    names = {name for name, _, _ in out}
    expected = {"token_embd.weight", "position_embd.weight", "token_types.weight", f"blk.{n_layers - 1}.ffn_down.weight"}
    if missing := sorted(expected - names):
        raise ModelError(f"The checkpoint lacks the tensors {', '.join(missing)}.")
    return out
