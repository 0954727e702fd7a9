"""Bounded, stepwise zlib inflation (ingress/inflate.py): the output is exact however the input is
cut, each step stays within its bounds, and a bomb stops at the limit having held no more than the
limit and a step."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib

import pytest

from conveyor.ingress.inflate import (
    INFLATE_FIRST,
    INFLATE_INPUT,
    INFLATE_STEP,
    Inflate,
    InflatedTooLarge,
    TrailingBytes,
    Truncated,
)

LEVEL = "unit"

GZIP, ZLIB, RAW = 31, 15, -15


def inflate_all(body: bytes, wbits: int, limit: int, cut: int, members: bool = False) -> bytes:
    inflate = Inflate(wbits, limit, members=members)
    for pos in range(0, len(body), cut):
        inflate.give(body[pos:pos + cut])
        while inflate.more:
            made = inflate.step()
            assert 0 <= made <= max(INFLATE_FIRST, INFLATE_STEP)
    return inflate.finish()


def compressed(plain: bytes, wbits: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return c.compress(plain) + c.flush()


@pytest.mark.parametrize("wbits", [GZIP, ZLIB, RAW])
@pytest.mark.parametrize("cut", [1, 1000, INFLATE_INPUT + 1, 1 << 30])
def test_output_is_exact_however_the_input_is_cut(wbits: int, cut: int) -> None:
    # Random bytes, then zeros: steps that end on their output's size and on their input's.
    plain = os.urandom(100_000) + bytes(INFLATE_FIRST + 3 * INFLATE_STEP + 7)
    body = compressed(plain, wbits)
    if cut == 1:
        body, plain = compressed(plain[:5000], wbits), plain[:5000]
    assert inflate_all(body, wbits, len(plain), cut) == plain


def test_output_zlib_holds_with_no_input_left() -> None:
    # One byte, then a long run: the last input bytes make far more than a step.
    plain = b"a" + bytes(INFLATE_FIRST + 4 * INFLATE_STEP)
    assert inflate_all(compressed(plain, ZLIB), ZLIB, len(plain), 1 << 30) == plain


def test_gzip_members_back_to_back() -> None:
    body = gzip.compress(b"ab") + gzip.compress(b"cd") + gzip.compress(bytes(INFLATE_STEP + 1))
    for cut in (1, 7, len(body)):
        assert inflate_all(body, GZIP, 1 << 30, cut, members=True) == b"abcd" + bytes(INFLATE_STEP + 1)
    with pytest.raises(TrailingBytes):
        inflate_all(body, GZIP, 1 << 30, len(body))


def test_broken_streams() -> None:
    with pytest.raises(Truncated):
        inflate_all(gzip.compress(b"x" * 1000)[:-6], GZIP, 1 << 20, 100)
    with pytest.raises(TrailingBytes):
        inflate_all(zlib.compress(b"x" * 1000) + b"junk", ZLIB, 1 << 20, 100)
    with pytest.raises(zlib.error):
        inflate_all(b"not gzip at all", GZIP, 1 << 20, 100)


@pytest.mark.parametrize("limit", [0, 1, INFLATE_STEP, INFLATE_FIRST, INFLATE_FIRST + 5 * INFLATE_STEP + 3])
def test_a_body_of_exactly_the_limit_passes_and_one_byte_more_does_not(limit: int) -> None:
    plain = bytes(limit)
    assert inflate_all(compressed(plain, GZIP), GZIP, limit, 4096) == plain
    with pytest.raises(InflatedTooLarge):
        inflate_all(compressed(plain + b"\0", GZIP), GZIP, limit, 4096)


def test_a_body_the_first_step_inflates_whole_is_one_piece() -> None:
    plain = os.urandom(1000) * 3000  # 3 MB, a few KiB compressed
    inflate = Inflate(GZIP, 1 << 30)
    inflate.give(compressed(plain, GZIP))
    assert inflate.step() == len(plain) and not inflate.more
    assert inflate.finish() == plain


def test_a_bomb_holds_no_more_than_the_limit_and_a_step() -> None:
    limit = 2 * INFLATE_FIRST
    c = zlib.compressobj(9, zlib.DEFLATED, GZIP)
    block = bytes(INFLATE_STEP)
    bomb = b"".join([c.compress(block) for _ in range(128)] + [c.flush()])  # 128 MiB of zeros in ~128 KiB
    tracemalloc.start()
    try:
        inflate = Inflate(GZIP, limit)
        inflate.give(bomb)
        with pytest.raises(InflatedTooLarge):
            while inflate.more:
                inflate.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert inflate.size == limit  # it stopped at the limit, not at 128 MiB
    # The first step holds its output twice while zlib copies it out of its blocks; later, the limit and a step.
    assert peak < max(2 * INFLATE_FIRST, limit) + 3 * INFLATE_STEP, peak
