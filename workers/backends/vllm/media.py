"""A generation request's images: Triton's vllm_backend's ``image`` input (BYTES, one base64-encoded image per
element, ``dims: [-1]``), decoded as that backend decodes it (``base64.b64decode``, then Pillow, to RGB), into
vLLM's ``multi_modal_data``.

Checked before anything reaches the engine, each a 400 (INVALID_ARG) naming the input: the count and each
image's encoded size (``proto/llm_limits.py``), its format and declared pixels read from its header before the
pixels are decoded, and whether the engine takes images at all (a text-only model, or one whose
``limit_mm_per_prompt`` allows fewer). A request that fails here never reaches the engine, which serves the
next one as before.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

from conveyor.proto import llm_limits
from conveyor.proto.errors import invalid_arg

IMAGE_INPUT = "image"
_LENGTH = 4  # a BYTES element's little-endian length, before its bytes (as the ingress writes the tensor)


def elements(inputs: dict[str, np.ndarray]) -> list[bytes]:
    """The ``image`` input's elements (base64 text), counted and sized; [] without it."""
    array = inputs.get(IMAGE_INPUT)
    if array is None or array.size == 0:
        return []
    items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
    llm_limits.check_media_items(len(items), f"input '{IMAGE_INPUT}'")
    for item in items:
        llm_limits.check_media_b64(len(item), f"input '{IMAGE_INPUT}'")
    return items


def check_engine(count: int, limit: int, model: str) -> None:
    """``limit``: the images the engine takes in one prompt (0: a text-only model)."""
    if count and limit == 0:
        raise invalid_arg(f"model '{model}' does not take images: input '{IMAGE_INPUT}' is not supported")
    if count > limit:
        raise invalid_arg(f"At most {limit} image(s) may be provided in one prompt.")  # vLLM's words


def decode(items: list[bytes]) -> list[Any]:
    """The images as RGB Pillow images, each checked before its pixels are decoded."""
    from PIL import Image

    out = []
    for i, item in enumerate(items):
        where = f"input '{IMAGE_INPUT}'[{i}]"
        try:
            raw = base64.b64decode(item)
        except (binascii.Error, ValueError):
            raise invalid_arg(f"{where} is not valid base64") from None
        try:
            image = Image.open(io.BytesIO(raw), formats=llm_limits.IMAGE_FORMATS)
        except Image.DecompressionBombError:
            raise invalid_arg(f"{where}: the image has more than {llm_limits.MAX_IMAGE_PIXELS} pixels") from None
        except Exception:  # UnidentifiedImageError, and a header a parser chokes on
            raise invalid_arg(f"{where} is not an image in a format taken here "
                              f"({', '.join(llm_limits.IMAGE_FORMATS)})") from None
        width, height = image.size
        if width * height > llm_limits.MAX_IMAGE_PIXELS:
            raise invalid_arg(f"{where}: the image has {width}x{height} pixels; at most "
                              f"{llm_limits.MAX_IMAGE_PIXELS} are taken")
        try:
            out.append(image.convert("RGB"))  # decodes the pixels: a truncated or corrupt body fails here
        except Exception as exc:
            raise invalid_arg(f"{where} cannot be decoded: {exc}") from None
    return out


def media_bytes(items: list[bytes]) -> list[bytes]:
    """The images as the prefix keys hash them: each element as the ingress wrote it in the tensor (its length,
    then its bytes), so that the ingress and this worker compute the same keys."""
    return [len(item).to_bytes(_LENGTH, "little") + item for item in items]

