"""A fast reader for a GGUF file's metadata and tensor table.

``gguf.GGUFReader`` parses every field into numpy views, which takes seconds
for a large vocabulary; here long arrays (the vocabulary, merges, scores) are
skipped and only their length kept, so reading a 35B model's header is instant.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this are summarised as ArrayInfo instead of read.
_MAX_ARRAY = 4096


@dataclass(frozen=True)
class ArrayInfo:
    """A long array that was skipped: its element type and length."""

    type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] first
    type: int
    offset: int


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """``key`` with the architecture prefix filled in: ``get("block_count")``."""
        return self.metadata.get(f"{self.arch}.{key}", self.metadata.get(key, default))


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _string(fh: BinaryIO) -> str:
    n = _read(fh, "<Q")
    data = fh.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype == _ARRAY:
        etype = _read(fh, "<I")
        count = _read(fh, "<Q")
        if count > _MAX_ARRAY:
            if etype in _SCALARS:
                fh.seek(count * struct.calcsize(_SCALARS[etype]), 1)
            elif etype == _STRING:
                _skip_strings(fh, count)
            else:
                raise ValueError(f"nested array of type {etype}")
            return ArrayInfo(etype, count)
        return [_value(fh, etype) for _ in range(count)]
    raise ValueError(f"unknown value type {vtype}")


_LENGTH = struct.Struct("<Q")


def _skip_strings(fh: BinaryIO, count: int) -> None:
    """Move past ``count`` length-prefixed strings (a vocabulary of 262K tokens in a few milliseconds:
    the lengths are walked in a buffer, not read one call each)."""
    unpack = _LENGTH.unpack_from
    buf, pos, end = b"", 0, 0
    for _ in range(count):
        if pos + 8 > end:
            buf, pos = buf[pos:] + fh.read(1 << 20), 0
            end = len(buf)
            if end < 8:
                raise EOFError
        pos += 8 + unpack(buf, pos)[0]
        if pos > end:  # a string longer than what is buffered: skip the rest of it in the file
            fh.seek(pos - end, 1)
            buf, pos, end = b"", 0, 0
    fh.seek(pos - end, 1)  # give back what was read past the last string


def read_header(path: str | Path, *, tensors: bool = True) -> Header:
    """The metadata (and, by default, the tensor table) of a GGUF file."""
    path = Path(path)
    try:
        with open(path, "rb", buffering=1 << 16) as fh:
            if fh.read(4) != b"GGUF":
                raise ModelError(f"not a GGUF model (wrong magic bytes): {path}")
            version = _read(fh, "<I")
            n_tensors = _read(fh, "<Q")
            n_kv = _read(fh, "<Q")
            metadata = {}
            for _ in range(n_kv):
                key = _string(fh)
                metadata[key] = _value(fh, _read(fh, "<I"))
            infos: list[TensorInfo] = []
            if tensors:
                for _ in range(n_tensors):
                    name = _string(fh)
                    n_dims = _read(fh, "<I")
                    shape = tuple(_read(fh, "<Q") for _ in range(n_dims))
                    infos.append(TensorInfo(name, shape, _read(fh, "<I"), _read(fh, "<Q")))
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (EOFError, ValueError, struct.error, UnicodeDecodeError):
        raise ModelError(f"damaged or truncated GGUF file: {path}") from None
    return Header(version, metadata, infos)
