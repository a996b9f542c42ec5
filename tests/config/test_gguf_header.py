"""The fast GGUF header reader: long string arrays (a vocabulary) are walked past in a buffer, strings longer
than the buffer included, and the tensor table after them is read right; a model's facts are read once per
version of its file."""

from __future__ import annotations

import numpy as np

from pipeline.engine.gguf.header import ArrayInfo, read_header
from pipeline.engine.gguf.info import ModelInfo


def _write(path, strings: list[str], *, context: int = 4096) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context)
    writer.add_block_count(1)
    writer.add_array("test.strings", strings)
    writer.add_array("test.scores", [float(i) for i in range(len(strings))])
    writer.add_string("test.after", "kept")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_long_string_arrays_are_skipped_and_what_follows_is_read(tmp_path):
    import gguf

    # 9,000 strings of every length, two of them longer than the reader's 1 MiB buffer
    strings = ["t" * (i % 300) for i in range(9000)]
    strings[10] = "x" * (3 << 20)
    strings[8000] = "y" * ((1 << 20) + 7)
    path = tmp_path / "long.gguf"
    _write(path, strings)
    header = read_header(path)
    assert header.metadata["test.strings"] == ArrayInfo(8, len(strings))
    assert header.metadata["test.scores"] == ArrayInfo(6, len(strings))
    assert header.metadata["test.after"] == "kept"
    reference = gguf.GGUFReader(str(path))
    assert [(t.name, t.shape, t.offset) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.data_offset - reference.data_offset)) for t in reference.tensors]


def test_model_facts_are_read_again_when_the_file_changes(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, ["a", "b"], context=4096)
    first = ModelInfo.read(path)
    assert ModelInfo.read(path) is first  # read once
    _write(path, ["a", "b", "c"], context=8192)  # rewritten in place
    assert ModelInfo.read(path).n_ctx_train == 8192 and first.n_ctx_train == 4096
