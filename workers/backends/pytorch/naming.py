"""Which positional argument and which returned value each config tensor of a
TorchScript model is, by Triton's PyTorch backend naming rules.

A TorchScript file says too little about its tensors, so the config's names decide:

* inputs: every name is an argument of ``forward`` -> that argument; else every
  name is ``<name>__<index>`` -> that position; else the config's order.
* outputs: every name is ``<name>__<index>`` -> that element of the returned
  tuple; else the config's order.

As in Triton, ``<index>`` is whatever follows the first ``__`` and must be all digits.
"""

from __future__ import annotations

from collections.abc import Sequence


def _named_index(name: str) -> int | None:
    _, sep, tail = name.partition("__")
    return int(tail) if sep and tail.isdigit() else None


def input_positions(names: Sequence[str], forward_args: Sequence[str]) -> dict[str, int]:
    """The position in ``forward(...)`` of each config input."""
    if forward_args and all(n in forward_args for n in names):
        return {n: list(forward_args).index(n) for n in names}
    return _indexed_or_ordered(names)


def output_positions(names: Sequence[str]) -> dict[str, int]:
    """The index in the returned tuple of each config output."""
    return _indexed_or_ordered(names)


def _indexed_or_ordered(names: Sequence[str]) -> dict[str, int]:
    indices = [_named_index(n) for n in names]
    if all(i is not None for i in indices):
        return {n: i for n, i in zip(names, indices, strict=True) if i is not None}
    return {n: i for i, n in enumerate(names)}
