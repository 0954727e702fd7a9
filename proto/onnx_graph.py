"""An ONNX model's signature, read without its weights.

Completing a config needs the graph's inputs, outputs and initializer names only.
``onnx.load`` parses the whole protobuf in one call that holds the GIL: for a model
with weights inside the graph (up to 2 GiB) that is seconds during which the router's
loop thread cannot run. This reads the protobuf's wire format instead, field by field,
seeking over everything it does not need (the nodes, the tensors' data): a few reads
whatever the model's size, each of which releases the GIL.

Wire format: https://protobuf.dev/programming-guides/encoding/; the field numbers are
onnx.proto's (ModelProto.graph 7; GraphProto.initializer 5, input 11, output 12;
TensorProto.name 8, external_data 13).

Where an initializer's weights are in external data, the files it names are kept too
(``external_files``): the ONNX Runtime worker checks them before its session opens them. That reader
builds no ``onnx`` message, so a worker does not import onnx (a tenth of a second of its start-up on a
busy host, for a package ONNX Runtime does not need).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from conveyor.proto.repository_files import open_binary

if TYPE_CHECKING:
    import onnx

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
_TENSOR_NAME, _TENSOR_EXTERNAL_DATA = 8, 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2  # StringStringEntryProto
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MAX_SMALL = 64 << 20  # a value info or a name larger than this is no ONNX model


class _Fields:
    """The fields of one message between ``start`` and ``end`` of the file."""

    def __init__(self, f: BinaryIO, end: int) -> None:
        self.f = f
        self.end = end

    def _varint(self) -> int:
        shift = value = 0
        while True:
            b = self.f.read(1)
            if not b:
                raise ValueError("the file ends inside a field")
            value |= (b[0] & 0x7F) << shift
            if b[0] < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 10 bytes")

    def __iter__(self) -> _Fields:
        return self

    def __next__(self) -> tuple[int, int, int]:
        """(field number, wire type, length of a length-delimited value); the file is then at the value."""
        if self.f.tell() >= self.end:
            raise StopIteration
        tag = self._varint()
        field, wire = tag >> 3, tag & 7
        if wire == _LEN:
            length = self._varint()
            if self.f.tell() + length > self.end:
                raise ValueError(f"field {field} runs past the end of its message")
            return field, wire, length
        if wire not in (_VARINT, _I64, _I32) or field == 0:
            raise ValueError(f"wire type {wire} of field {field}: not a protobuf message ONNX writes")
        return field, wire, 0

    def skip(self, wire: int, length: int) -> None:
        if wire == _VARINT:
            self._varint()
        else:
            self.f.seek({_I64: 8, _I32: 4}.get(wire, length), os.SEEK_CUR)

    def read(self, length: int) -> bytes:
        if length > _MAX_SMALL:
            raise ValueError(f"a {length}-byte field where a small one belongs")
        data = self.f.read(length)
        if len(data) != length:
            raise ValueError("the file ends inside a field")
        return data


def _graphs(f: BinaryIO) -> Iterator[_Fields]:
    """The fields of each graph of the model in ``f`` (several are merged, as protobuf does); the caller
    reads each to its end before asking for the next."""
    model = _Fields(f, os.fstat(f.fileno()).st_size)
    for field, wire, length in model:
        if field == _MODEL_GRAPH and wire == _LEN:
            yield _Fields(f, f.tell() + length)
        else:
            model.skip(wire, length)


def read_signature(path: str) -> onnx.GraphProto:
    """The graph of the ONNX model in ``path`` with only its ``input``, ``output`` and each
    ``initializer``'s name and ``external_data`` filled in; ``ValueError`` (or ``OSError``) when it
    is no ONNX model."""
    import onnx  # here: only the router's config completion builds the messages (see the module's text)

    graph = onnx.GraphProto()
    with open_binary(path) as f:  # never a FIFO or a device (proto/repository_files.py)
        for fields in _graphs(f):
            _read_graph(fields, graph)
    return graph


def _read_graph(fields: _Fields, graph: onnx.GraphProto) -> None:
    for field, wire, length in fields:
        if wire == _LEN and field in (_GRAPH_INPUT, _GRAPH_OUTPUT):
            target = graph.input if field == _GRAPH_INPUT else graph.output
            target.add().ParseFromString(fields.read(length))
        elif wire == _LEN and field == _GRAPH_INITIALIZER:
            end = fields.f.tell() + length
            tensor = graph.initializer.add()
            inner = _Fields(fields.f, end)
            for tfield, twire, tlength in inner:
                if tfield == _TENSOR_NAME and twire == _LEN:
                    tensor.name = inner.read(tlength).decode("utf-8")
                elif tfield == _TENSOR_EXTERNAL_DATA and twire == _LEN:  # where its weights are: a few words
                    tensor.external_data.add().ParseFromString(inner.read(tlength))
                else:
                    inner.skip(twire, tlength)  # the weights: never read
            fields.f.seek(end)
        else:
            fields.skip(wire, length)


def external_files(path: str) -> list[str]:
    """The files the initializers of the ONNX model in ``path`` keep their weights in (their
    ``location``, relative to the model's folder, as ONNX Runtime reads them); errors as ``read_signature``."""
    folder = os.path.dirname(path)
    found: set[str] = set()
    with open_binary(path) as f:
        for fields in _graphs(f):
            for field, wire, length in fields:
                if not (wire == _LEN and field == _GRAPH_INITIALIZER):
                    fields.skip(wire, length)
                    continue
                end = f.tell() + length
                tensor = _Fields(f, end)
                for tfield, twire, tlength in tensor:
                    if tfield == _TENSOR_EXTERNAL_DATA and twire == _LEN:
                        key, value = _entry(tensor.read(tlength))
                        if key == "location":
                            found.add(os.path.join(folder, value))
                    else:
                        tensor.skip(twire, tlength)
                f.seek(end)
    return sorted(found)


def _entry(data: bytes) -> tuple[str, str]:
    """A ``StringStringEntryProto``'s key and value (the last of each, as protobuf merges them)."""
    key = value = ""
    fields = _Fields(io.BytesIO(data), len(data))
    for field, wire, length in fields:
        if wire == _LEN and field in (_ENTRY_KEY, _ENTRY_VALUE):
            text = fields.read(length).decode("utf-8")
            key, value = (text, value) if field == _ENTRY_KEY else (key, text)
        else:
            fields.skip(wire, length)
    return key, value
