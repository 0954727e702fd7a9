"""Triton's classification extension: top-k of an output as "value:index[:label]"."""

from __future__ import annotations

import functools
import io
import os

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg, unavailable
from conveyor.proto.repository_files import read_text, unreadable


def load_labels(model_dir: str, config: mc.ModelConfig) -> dict[str, list[str]]:
    """Labels per output, from each output's ``label_filename`` in the model directory."""
    labels: dict[str, list[str]] = {}
    for out in config.output:
        if out.label_filename:
            path = os.path.join(model_dir, out.label_filename)
            try:
                labels[out.name] = _read_labels(path)
            except OSError as exc:  # Triton's label provider reads it with ReadTextFile: its words
                raise unavailable(unreadable(path, exc)) from None
    return labels


@functools.lru_cache(maxsize=64)
def label_file(path: str) -> list[str] | None:
    """The labels an ensemble's output names for a step (``OutputSpec.labels_path``), read once;
    None when the file cannot be read (the answer then has no labels, as without a file)."""
    try:
        return _read_labels(path)
    except OSError:
        return None


def _read_labels(path: str) -> list[str]:
    # Lines as a text file reads them (universal newlines), never a FIFO's wait (proto/repository_files.py).
    return [line.rstrip("\n") for line in io.StringIO(read_text(path), newline=None)]


# The datatypes Triton ranks (its TopkClassifications): integers, FP32 and FP64.
CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})
# Triton's bound on an output ranked for classification (kMaxClassificationElements): ranking costs its
# size in time and memory, whatever class_count asks.
MAX_CLASSIFICATION_ELEMENTS = 1_000_000


def classify(array: np.ndarray, k: int, labels: list[str] | None, batched: bool, datatype: str) -> np.ndarray:
    """Top ``k`` of each row (each batch entry) as BYTES strings, best first; Triton's INVALID_ARG for an output
    of a datatype it does not rank, or one too large."""
    if datatype not in CLASSIFIABLE:
        raise invalid_arg(f"class result not available for output due to unsupported type '{datatype}'")
    if array.size > MAX_CLASSIFICATION_ELEMENTS:
        raise invalid_arg("classification output tensor too large")
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    floating = np.issubdtype(rows.dtype, np.floating)
    for r, row in enumerate(rows):
        top = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, idx in enumerate(top):
            value = f"{float(row[idx]):f}" if floating else str(int(row[idx]))
            text = f"{value}:{int(idx)}"
            if labels is not None and idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode("utf-8")
    return out if batched else out.reshape(k)
