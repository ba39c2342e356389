"""read_header against the `gguf` package's own reader, and malformed files."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from vllm_metal.gguf.header import read_header


def test_tensor_table_matches_gguf_reader(tiny_gguf):
    import gguf

    path = tiny_gguf("qwen2", "Q4_1")
    ours = read_header(path)
    reader = gguf.GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape))
        assert info.ggml_type == int(t.tensor_type)
        assert info.type_name == t.tensor_type.name
        assert info.offset == t.data_offset


def test_metadata_matches_gguf_reader(tiny_gguf):
    import gguf

    path = tiny_gguf("llama", "F32")
    ours = read_header(path).metadata
    reader = gguf.GGUFReader(path)
    assert set(ours) == set(reader.fields) - {"GGUF.version", "GGUF.tensor_count",
                                               "GGUF.kv_count"}
    for key in ours:
        expected = reader.fields[key].contents()
        if isinstance(expected, float):
            assert ours[key] == pytest.approx(expected)
        else:
            assert ours[key] == expected, key


def test_read_dense_matches_gguf_reader(tiny_gguf):
    import gguf

    path = tiny_gguf("llama", "F16")
    header = read_header(path)
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name in ("blk.0.attn_q.weight", "output_norm.weight"):
        expected = np.asarray(reader[name].data, dtype=np.float32)
        np.testing.assert_array_equal(header.read_dense(name), expected.reshape(
            header.tensors[name].shape))


def test_read_dense_refuses_quantized_tensor(tiny_gguf):
    header = read_header(tiny_gguf("llama", "Q8_0"))
    with pytest.raises(ValueError, match="blk.0.attn_q.weight.*Q8_0"):
        header.read_dense("blk.0.attn_q.weight")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_header(path)


def test_too_short_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="too short"):
        read_header(path)


def test_unsupported_version(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(ValueError, match="version 1"):
        read_header(path)


def test_truncated_header(tiny_gguf, tmp_path):
    data = tiny_gguf("llama", "F32").read_bytes()
    path = tmp_path / "model.gguf"
    path.write_bytes(data[:2000])  # cut inside the tokenizer metadata
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_header(path)
