"""The header of a GGUF file: metadata, and the tensor table (names, shapes, types, offsets).

Parsed here rather than taken from `mx.load` because (1) `mx.load` reports no GGUF tensor
types and silently dequantizes some (K-quants, BF16) to float16, so the loader must see
the types before MLX touches the data; (2) config and tokenizer need only the header, not
gigabytes of weights; (3) tensors are read one at a time from a memory map, so loading
never holds a second copy of the file.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGML tensor type ids (ggml.h) -> names used in messages.
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
    15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
    26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}

# Metadata value type ids (GGUF spec) -> little-endian numpy dtypes.
_SCALAR_DTYPES = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
    10: "<u8", 11: "<i8", 12: "<f8",
}
_BOOL, _STRING, _ARRAY = 7, 8, 9

# Dense tensor types readable straight from the file.
_DENSE_DTYPES = {0: np.float32, 1: np.float16, 30: np.uint16}  # BF16 read as raw bits


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: `shape` in MLX/numpy order (GGUF lists dims innermost first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute byte offset of the data in the file

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"type {self.ggml_type}")


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]  # scalars as Python values, arrays as lists
    tensors: dict[str, TensorInfo]

    def read_raw(self, name: str, nbytes: int) -> np.ndarray:
        """The first `nbytes` bytes of tensor `name`'s data: uint8 [nbytes], memory-mapped."""
        info = self.tensors[name]
        if info.offset + nbytes > os.path.getsize(self.path):
            raise ValueError(f"{self.path!r}: tensor {name!r} runs past the end of the file")
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset,
                         shape=(nbytes,))

    def read_dense(self, name: str) -> np.ndarray:
        """A F32/F16/BF16 tensor as (exact) float32, shape `tensors[name].shape`."""
        info = self.tensors[name]
        if info.ggml_type not in _DENSE_DTYPES:
            raise ValueError(f"tensor {name!r} is {info.type_name}, not a dense float type")
        dtype = _DENSE_DTYPES[info.ggml_type]
        count = int(np.prod(info.shape, dtype=np.int64))
        data = np.fromfile(self.path, dtype=dtype, count=count, offset=info.offset)
        if data.size != count:
            raise ValueError(f"{self.path!r}: tensor {name!r} runs past the end of the file")
        if info.ggml_type == 30:  # bf16 bits are the high half of a float32
            return (data.astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
        return data.astype(np.float32).reshape(info.shape)


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse the metadata and tensor table of the GGUF file at `path`."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 24:
            raise ValueError(f"{path!r} is not a GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(buf, path)
            except (struct.error, IndexError, UnicodeDecodeError) as e:
                raise ValueError(f"{path!r}: truncated or corrupt GGUF header ({e})") from e


def _parse(buf: mmap.mmap, path: str) -> GGUFHeader:
    if buf[:4] != _MAGIC:
        raise ValueError(f"{path!r} is not a GGUF file (magic {bytes(buf[:4])!r})")
    (version,) = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        # Version 1 used 32-bit counts; a byte-swapped version means a big-endian file.
        raise ValueError(f"{path!r}: GGUF version {version} is not supported (only 2 and 3)")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    pos = 24
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = _read_string(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        metadata[key], pos = _read_value(buf, pos + 4, vtype)

    infos = []
    for _ in range(n_tensors):
        name, pos = _read_string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        pos += 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = pos + (-pos) % alignment
    tensors = {n: TensorInfo(n, shape, t, data_start + off) for n, shape, t, off in infos}
    if len(tensors) != len(infos):
        raise ValueError(f"{path!r}: duplicate tensor names in the GGUF header")
    return GGUFHeader(path, version, metadata, tensors)


def _read_string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + length
    if end > len(buf):
        raise IndexError("string runs past the end of the file")
    return buf[pos + 8:end].decode("utf-8", errors="surrogateescape"), end


def _read_value(buf: mmap.mmap, pos: int, vtype: int) -> tuple[Any, int]:
    if vtype in _SCALAR_DTYPES:
        dtype = np.dtype(_SCALAR_DTYPES[vtype])
        value = np.frombuffer(buf, dtype, 1, pos)[0].item()
        return (bool(value) if vtype == _BOOL else value), pos + dtype.itemsize
    if vtype == _STRING:
        return _read_string(buf, pos)
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _SCALAR_DTYPES:
            dtype = np.dtype(_SCALAR_DTYPES[etype])
            values = np.frombuffer(buf, dtype, count, pos)
            values = values.astype(bool) if etype == _BOOL else values
            return values.tolist(), pos + count * dtype.itemsize
        items = []
        for _ in range(count):
            item, pos = _read_value(buf, pos, etype)
            items.append(item)
        return items, pos
    raise ValueError(f"unknown GGUF metadata value type {vtype}")
