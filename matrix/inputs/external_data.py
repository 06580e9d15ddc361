"""A model's external data (weights in files beside it), read by the runner itself, so bounded first.

Every tensor that names external data, in the main graph, any subgraph or a local function, is
checked before a byte is read: its location a relative path inside the model's folder (no NUL, no
`..` or absolute path, no symbolic link on the way, a regular file), its offset and length inside
that file; then all lengths are summed against the memory limit and the 2 GB a serialized model
may hold. Only then is each tensor's data read into the model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from .. import options, userfiles
from ..errors import InputError

# A ModelProto serialized above 2 GiB cannot be checked or shape-inferred in memory (protobuf's limit).
PROTOBUF_LIMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class Source:
    tensor: onnx.TensorProto
    path: Path
    offset: int
    length: int


def load_all(tensors: Iterable[onnx.TensorProto], folder: Path, limit_bytes: int, model_bytes: int = 0) -> int:
    """Read every external tensor's bytes into it, once all of them are known to be safe and to fit; the size of
    the data files they came from, whole (what ships beside the model, padding and unread bytes included)."""
    root = folder.resolve()
    sources = [_source(tensor, root) for tensor in tensors if uses_external_data(tensor)]
    total = sum(source.length for source in sources)
    if total > limit_bytes:
        raise InputError(f"the model's external data takes {options.memory_text(total)}, above the memory limit "
                         f"{options.memory_text(limit_bytes)}")
    if total + model_bytes > PROTOBUF_LIMIT_BYTES:
        raise InputError(f"the model with its external data takes {options.memory_text(total + model_bytes)}: above the "
                         "2 GiB ONNX's checker and shape inference hold in memory")
    for source in sources:
        _read_into(source)
    return sum(path.stat().st_size for path in {source.path for source in sources})


def _source(tensor: onnx.TensorProto, root: Path) -> Source:
    name = userfiles.one_line(tensor.name, 100)
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    if not location or "\0" in location:
        raise InputError(f"tensor {name!r} names external data {userfiles.one_line(repr(location), 100)}: not a file name")
    if Path(location).is_absolute() or not (root / location).resolve().is_relative_to(root):
        raise InputError(f"tensor {name!r} points to external data outside the model's folder: refused")
    path = _without_links(root, Path(location), name)
    offset, length = _number(entries, "offset", 0, name), _number(entries, "length", None, name)
    with userfiles.open_regular(path, "external data") as stream:
        size = os.fstat(stream.fileno()).st_size
    length = size - offset if length is None else length
    if offset + length > size or length < 0:
        raise InputError(f"tensor {name!r}: external data at offset {offset}, {length} bytes, but "
                         f"{userfiles.one_line(location, 100)!r} holds {size} bytes")
    return Source(tensor, path, offset, length)


def _without_links(root: Path, location: Path, name: str) -> Path:
    """root / location, once no part of it below root is a symbolic link (a link could be changed to lead
    outside the folder between this check and the read)."""
    path = root
    for part in location.parts:
        path = path / part
        if path.is_symlink():
            raise InputError(f"tensor {name!r} reaches its external data through the symbolic link {part!r}: refused "
                             "(a link can lead outside the model's folder)")
    if not path.exists():
        raise InputError(f"tensor {name!r} needs external data file {userfiles.one_line(str(location), 100)!r}, which is missing")
    return path


def _number(entries: dict, key: str, default: int | None, name: str) -> int | None:
    if key not in entries:
        return default
    text = entries[key]
    if not text.isdigit() or len(text) > 19:
        raise InputError(f"tensor {name!r}: external data {key} {userfiles.one_line(text, 40)!r} is not a byte count")
    return int(text)


def _read_into(source: Source) -> None:
    with userfiles.open_regular(source.path, "external data") as stream:
        stream.seek(source.offset)
        data = stream.read(source.length)
    if len(data) != source.length:  # the file shrank since it was checked
        raise InputError(f"tensor {userfiles.one_line(source.tensor.name, 100)!r}: its external data was cut short")
    source.tensor.raw_data = data
    source.tensor.data_location = onnx.TensorProto.DEFAULT
    del source.tensor.external_data[:]
