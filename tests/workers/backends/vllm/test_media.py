"""The vLLM backend's ``image`` input (Triton's vllm_backend's: BYTES, one base64 image per element), as the
backend reads it before the engine sees anything (workers/backends/vllm/media.py): its limits
(proto/llm_limits.py), each a 400, and the prefix keys the image is hashed into, the same as the ingress's.
With the engine: tests/workers/backends/vllm/test_vlm_e2e.py."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
import pytest

from conveyor.ingress.prefix_key import prefix_key
from conveyor.proto import llm_limits
from conveyor.proto import messages as m
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.backends.vllm import media
from conveyor.workers.backends.vllm.request import parse, prefix_keys

LEVEL = "unit"

PROMPT = "the quick brown fox jumps over the lazy dog. " * 3  # 135 bytes: 2 whole blocks


def _png(width: int = 8, height: int = 8, color: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data)


def _item(*images: bytes, prompt: str = PROMPT) -> RequestItem:
    arrays = {"text_input": np.array([prompt.encode()], dtype=object)}
    if images:
        arrays["image"] = np.array(list(images), dtype=object)
    return RequestItem("r", arrays, [], {})


def _refused(match: str) -> Any:
    return pytest.raises(ConveyorError, match=match)


def test_images_decode_as_triton_decodes_them() -> None:
    args = parse(_item(_b64(_png(5, 7))))
    (image,) = media.decode(args.images)
    assert image.mode == "RGB" and image.size == (5, 7) and image.getpixel((0, 0)) == (200, 10, 10)
    assert parse(_item()).images == []  # no input: a text prompt, as before


def test_the_count_and_each_images_size_are_bounded_before_decoding() -> None:
    one = _b64(_png())
    assert len(parse(_item(*[one] * llm_limits.MAX_MEDIA_ITEMS)).images) == llm_limits.MAX_MEDIA_ITEMS
    with _refused(f"at most {llm_limits.MAX_MEDIA_ITEMS} are taken") as err:
        parse(_item(*[one] * (llm_limits.MAX_MEDIA_ITEMS + 1)))
    assert err.value.status == Status.INVALID_ARG
    with _refused(f"at most {llm_limits.MAX_MEDIA_B64_CHARS}"):
        parse(_item(b"A" * (llm_limits.MAX_MEDIA_B64_CHARS + 4)))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares its size and holds almost no pixels (a few bytes that inflate to a few)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) \
        + _chunk(b"IEND", b"")


@pytest.mark.parametrize(("data", "why"), [
    (b"!!!not base64", "is not valid base64"),
    (_b64(b"plain text, no image"), "is not an image in a format taken here"),
    (_b64(_png_header(8192, 8192)), "8192x8192 pixels; at most"),  # a 40-byte bomb: refused from its header
    (_b64(_png_header(100_000, 100_000)), "pixels"),  # past Pillow's own bomb check too
    (_b64(_png(64, 64)[:60]), "cannot be decoded"),  # its header read, its pixels cut short
])
def test_an_image_that_cannot_be_decoded_is_a_400_naming_it(data: bytes, why: str) -> None:
    with _refused(f"input 'image'\\[1\\].*{why}") as err:
        media.decode(parse(_item(_b64(_png()), data)).images)
    assert err.value.status == Status.INVALID_ARG


def test_the_engine_decides_whether_and_how_many() -> None:
    media.check_engine(1, 1, "vlm")
    with _refused("model 'text' does not take images"):
        media.check_engine(1, 0, "text")
    with _refused("At most 1 image"):  # vLLM's words of its limit_mm_per_prompt
        media.check_engine(2, 1, "vlm")


def _ingress_keys(item: RequestItem, params: dict[str, object]) -> list[int]:
    """The keys the ingress computes from the same inputs in its arena (ingress/prefix_key.py)."""
    refs, arena = [], bytearray()
    for name, array in item.inputs.items():
        data = serialize_bytes(array)
        refs.append(m.TensorRef(name, "BYTES", list(array.shape), "arena", len(arena), len(data)))
        arena += data
    buf = np.frombuffer(bytes(arena), dtype=np.uint8)
    return prefix_key(refs, lambda offset, nbytes: buf[offset:offset + nbytes], params)


def test_the_image_is_in_the_prefix_keys_the_same_at_ingress_and_worker() -> None:
    red, blue = _b64(_png()), _b64(_png(color=(0, 0, 250)))
    keys = {}
    for name, images in {"none": (), "red": (red,), "blue": (blue,), "both": (red, blue)}.items():
        item = _item(*images)
        worker, of_ids = prefix_keys(item, parse(item))
        assert not of_ids and worker == _ingress_keys(item, {}) and len(worker) == 2
        keys[name] = worker
    assert len({tuple(k) for k in keys.values()}) == 4  # another image: no cached block in common
    again = _item(_b64(_png()))
    assert prefix_keys(again, parse(again))[0] == keys["red"]  # the same image and prompt: its cached prefix
