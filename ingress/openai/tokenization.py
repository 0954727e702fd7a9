"""``POST /tokenize`` and ``POST /detokenize``, in vLLM's shapes, with the model's own tokenizer
(``tokenizer.py``).

``/tokenize`` takes a ``prompt`` (special tokens added unless ``add_special_tokens`` is false) or
chat ``messages`` (written with the model's chat template, as ``/v1/chat/completions`` writes them,
``add_generation_prompt`` and ``tools`` included; no special tokens added unless asked, the template
writes them) and answers ``{"count", "max_model_len", "tokens", "token_strs"}``; ``/detokenize`` takes
``tokens`` and answers ``{"prompt"}``. ``model`` may be left out when the ingress serves one model
(vLLM's server serves one); it may name an adapter, whose tokenizer is its base model's. A model
without ``tokenizer.json`` is a 400 that says so.
"""

from __future__ import annotations

import falcon
import falcon.asgi
import msgspec
import orjson

from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai.catalog import Catalog, LlmModel
from conveyor.ingress.openai.schema import DetokenizeRequest, TokenizeRequest, chat_messages, decode
from conveyor.ingress.openai.tokenizer import Tokenizer
from conveyor.ingress.openai.tools import check_tools
from conveyor.proto.errors import invalid_arg


class _Tokenization:
    def __init__(self, catalog: Catalog, max_body_bytes: int, max_json_bytes: int = 0) -> None:
        self._catalog = catalog
        self._max_body_bytes = max_body_bytes
        self._max_json_bytes = max_json_bytes

    async def _tokenizer(self, name: str | None) -> tuple[LlmModel, Tokenizer]:
        if name is None:
            listed = {row.model.name for row in await self._catalog.listed()}
            if len(listed) != 1:
                raise invalid_arg(f"`model` is required: this server serves {len(listed)} models")
            name = listed.pop()
        model = (await self._catalog.target(name)).model
        tokenizer = await self._catalog.tokenizer(model)
        if tokenizer is None:
            raise invalid_arg(f"model '{model.name}' has no tokenizer (a tokenizer.json in its tokenizer folder: "
                              "its model.json's, its config's `tokenizer` parameter, or its version directory)")
        return model, tokenizer


class Tokenize(_Tokenization):
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = decode(await read_body(req, resp, self._max_body_bytes, self._max_json_bytes), TokenizeRequest)
        if (request.prompt is None) == (request.messages is None):
            raise invalid_arg("give either `prompt` or `messages`")
        if request.continue_final_message:
            raise invalid_arg("`continue_final_message` is not supported")
        model, tokenizer = await self._tokenizer(request.model)
        if request.messages is not None:
            messages = chat_messages(request)  # first: within the limits of a chat request's (llm_limits.py)
            if request.tools:
                check_tools(request.tools)
            template = await self._catalog.chat_template(model)
            tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
            text = template.prompt(messages, request.add_generation_prompt, tools)
            special = bool(request.add_special_tokens)
        else:
            text = request.prompt or ""
            special = request.add_special_tokens is not False
        tokens = tokenizer.encode(text, special)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"count": len(tokens), "max_model_len": tokenizer.max_model_len, "tokens": tokens,
                                  "token_strs": tokenizer.token_strs(tokens) if request.return_token_strs else None})


class Detokenize(_Tokenization):
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = decode(await read_body(req, resp, self._max_body_bytes, self._max_json_bytes), DetokenizeRequest)
        _, tokenizer = await self._tokenizer(request.model)
        size = tokenizer.vocab_size
        bad = next((t for t in request.tokens if not 0 <= t < size), None)
        if bad is not None:
            raise invalid_arg(f"token id {bad} is out of the vocabulary (0 to {size - 1})")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"prompt": tokenizer.decode(request.tokens)})
