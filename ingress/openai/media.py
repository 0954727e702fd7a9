"""The images of a chat request (``image_url`` content parts), as the model's ``image`` input takes them:
Triton's vllm_backend's, one base64-encoded image per BYTES element. The worker decodes them
(workers/backends/vllm/media.py); here each URL is read to its bytes, within ``proto/llm_limits.py``'s count
and size, before anything is sent:

* a ``data:`` URL (``data:image/png;base64,...``): its base64 text as it is, never decoded here;
* an ``http(s)`` URL: fetched only when the operator allows it (``--openai-fetch-remote-media``, off by
  default: a server that fetches what its clients name reaches what they cannot), within
  ``MAX_MEDIA_BYTES`` and ``--openai-media-fetch-timeout-secs``;
* a ``file:`` URL: read only under ``--allowed-local-media-path`` (vLLM's flag; unset: none), after its
  links are resolved.

Anything else, and ``input_audio`` (no Triton vLLM contract carries audio yet), is a 400.
"""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from conveyor.proto import llm_limits
from conveyor.proto.errors import invalid_arg

IMAGE_INPUT = "image"  # Triton's vllm_backend's input of a request's images
FETCH_TIMEOUT_S = 10.0  # the default of --openai-media-fetch-timeout-secs: a whole remote image, headers to body
_FETCH_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class MediaOptions:
    fetch_remote: bool = False  # --openai-fetch-remote-media
    fetch_timeout_s: float = FETCH_TIMEOUT_S  # --openai-media-fetch-timeout-secs
    local_path: str = ""  # --allowed-local-media-path: "" reads no local file


NO_MEDIA_OPTIONS = MediaOptions()  # the defaults: data: URLs only


def count(urls: list[str]) -> None:
    llm_limits.check_media_items(len(urls), "`messages`")


async def image_b64(url: str, options: MediaOptions) -> bytes:
    """The image ``url`` names, as base64 text."""
    if url.startswith("data:"):
        return _data_url(url)
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        if not options.fetch_remote:
            raise invalid_arg("image_url: this server fetches no remote media (a `data:` URL carries the image "
                              "itself; the operator allows http(s) URLs with --openai-fetch-remote-media)")
        return base64.b64encode(await _fetch(url, options.fetch_timeout_s))
    if scheme == "file":
        return base64.b64encode(await asyncio.to_thread(_local_file, url, options.local_path))
    raise invalid_arg("image_url: the URL must be a `data:` URL (or, where the operator allows them, http(s) or "
                      "file:)")


def _data_url(url: str) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise invalid_arg("image_url: a `data:` URL must be base64-encoded (data:<type>;base64,<data>)")
    llm_limits.check_media_b64(len(payload), "image_url")
    return payload.encode("ascii", "replace")


async def _fetch(url: str, timeout_s: float) -> bytes:
    import httpx

    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(follow_redirects=False) as client:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise invalid_arg(f"image_url: fetching {url} answered {response.status_code}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > llm_limits.MAX_MEDIA_BYTES:
                    raise _too_large()
                body = bytearray()
                async for chunk in response.aiter_bytes(_FETCH_CHUNK):
                    body += chunk
                    if len(body) > llm_limits.MAX_MEDIA_BYTES:
                        raise _too_large()
                return bytes(body)
    except TimeoutError:
        raise invalid_arg(f"image_url: fetching {url} took more than {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise invalid_arg(f"image_url: fetching {url} failed: {type(exc).__name__}") from None


def _too_large() -> Exception:
    return invalid_arg(f"image_url: the image is larger than {llm_limits.MAX_MEDIA_BYTES} bytes")


def _local_file(url: str, allowed: str) -> bytes:
    if not allowed:
        raise invalid_arg("image_url: this server reads no local files (the operator allows a folder with "
                          "--allowed-local-media-path)")
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise invalid_arg("image_url: a file: URL must name a local path")
    root = os.path.realpath(allowed)
    path = os.path.realpath(unquote(parts.path))  # its links resolved: none leads out of the folder
    if os.path.commonpath([root, path]) != root:
        raise invalid_arg("image_url: the file is not under the folder this server reads media from")
    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused), never waits for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        raise invalid_arg("image_url: the file cannot be read") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device would be waited on or read forever
            raise invalid_arg("image_url: the path is not a regular file")
        try:
            data = f.read(llm_limits.MAX_MEDIA_BYTES + 1)
        except OSError:
            raise invalid_arg("image_url: the file cannot be read") from None
    if len(data) > llm_limits.MAX_MEDIA_BYTES:
        raise _too_large()
    return data
