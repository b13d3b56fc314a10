"""Read the variables of a CTranslate2 ``model.bin`` without loading a runtime.

The format is the one ``ctranslate2/specs/model_spec.py`` writes (binary version 6): a header
(version, spec name, spec revision), then each variable as name, rank, dims, dtype id, byte
count and raw bytes, then aliases (name -> variable name). We read it with ``numpy.memmap`` so
that asking for one tensor (the token embedding) does not read the 75 MB file into memory.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Dict, Iterator, Tuple

import numpy as np

# The order matches the DataType enum of CTranslate2 (include/ctranslate2/types.h).
_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_SUPPORTED_BINARY_VERSIONS = (6,)


class ModelFileError(ValueError):
    """``model.bin`` is missing, truncated or in a format this reader does not know."""


@dataclass(frozen=True)
class _Entry:
    offset: int
    shape: Tuple[int, ...]
    dtype: str


def _read(stream: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    raw = stream.read(size)
    if len(raw) != size:
        raise ModelFileError("model.bin ends in the middle of its header")
    return struct.unpack(fmt, raw)[0]


def _read_string(stream: BinaryIO) -> str:
    length = _read(stream, "H")
    raw = stream.read(length)
    if len(raw) != length:
        raise ModelFileError("model.bin ends in the middle of a variable name")
    return raw[:-1].decode("utf-8")


class CT2ModelFile:
    """The variables of one ``model.bin``, read lazily.

    Example::

        weights = CT2ModelFile("model_dir/model.bin")
        embedding = weights["decoder/embeddings/weight"]   # [vocab, d_model] float16
    """

    def __init__(self, path: str) -> None:
        if os.path.isdir(path):
            path = os.path.join(path, "model.bin")
        if not os.path.isfile(path):
            raise ModelFileError(f"no CTranslate2 model file at {path}")
        self.path = path
        self._entries: Dict[str, _Entry] = {}
        self._aliases: Dict[str, str] = {}
        file_size = os.path.getsize(path)
        with open(path, "rb") as stream:
            version = _read(stream, "I")
            if version not in _SUPPORTED_BINARY_VERSIONS:
                raise ModelFileError(
                    f"{path}: binary version {version} is not supported "
                    f"(this reader knows {_SUPPORTED_BINARY_VERSIONS})"
                )
            self.spec_name = _read_string(stream)
            self.spec_revision = _read(stream, "I")
            for _ in range(_read(stream, "I")):
                name = _read_string(stream)
                rank = _read(stream, "B")
                shape = tuple(_read(stream, "I") for _ in range(rank))
                type_id = _read(stream, "B")
                if type_id >= len(_DTYPES):
                    raise ModelFileError(f"{path}: variable {name} has unknown dtype id {type_id}")
                num_bytes = _read(stream, "I")
                offset = stream.tell()
                if offset + num_bytes > file_size:
                    raise ModelFileError(f"{path} is truncated inside variable {name}")
                self._entries[name] = _Entry(offset, shape, _DTYPES[type_id])
                stream.seek(num_bytes, os.SEEK_CUR)
            for _ in range(_read(stream, "I")):
                alias = _read_string(stream)
                self._aliases[alias] = _read_string(stream)

    def names(self) -> Iterator[str]:
        """Every variable and alias name in the file."""
        yield from self._entries
        yield from self._aliases

    def weight_dtypes(self) -> set:
        """The dtypes its weights are saved in ("float16", "int8", ...): the variables named
        ``.../weight``, which CTranslate2 quantizes and infers a saved model's type from (the
        settings beside them, such as ``decoder/num_heads``, are small integers in any model)."""
        return {entry.dtype for name, entry in self._entries.items() if name.endswith("weight")}

    def __contains__(self, name: str) -> bool:
        return name in self._entries or name in self._aliases

    def resolve(self, name: str) -> str:
        """The variable an alias points to (``name`` itself if it is not an alias)."""
        return self._aliases.get(name, name)

    def __getitem__(self, name: str) -> np.ndarray:
        """A read-only view of one variable (bfloat16 comes back as its raw uint16 bits)."""
        target = self.resolve(name)
        if target not in self._entries:
            raise KeyError(f"{name!r} is not a variable of {self.path}")
        entry = self._entries[target]
        dtype = "uint16" if entry.dtype == "bfloat16" else entry.dtype
        count = int(np.prod(entry.shape)) if entry.shape else 1
        array = np.memmap(self.path, dtype=dtype, mode="r", offset=entry.offset, shape=(count,))
        return array.reshape(entry.shape)
