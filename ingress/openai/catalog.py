"""Which models this ingress serves as OpenAI models, their adapters and tokenizers.

A model is a generative one when it takes the ``text_input`` / ``text_output`` contract
(``contract.py``): the ``vllm`` backend, or any model written to the same shape, a Python one
decoupled or not. What the ingress needs from the model's files, it reads from the serving
version's directory, which the router names (control op ``model_directory``): ``model.json``
(the vLLM engine's arguments, which may name the tokenizer folder) and the adapters of its repository
(``multi_lora.json`` and ``loras/``, ``proto/lora.py``); where the tokenizer folder is: ``tokenizer.py``.
Adapters loaded at run time (``/v1/load_lora_adapter``) are the router's to list (control op
``lora_adapters``), read again each time the repository generation changes, as each load and unload makes it.
From its config (control op ``model_config``) it reads the ``TOOL_CALL_PARSER`` parameter: a frontend
setting, as vLLM's ``--tool-call-parser`` is, so not in ``model.json``, whose keys are all engine arguments
(Triton's backend, and ours, pass them to the engine, which refuses any other), the ``tokenizer``
parameter, and ``MAX_MIGRATIONS`` (``migration.py``). All of it is kept per model until the model's
signature is refetched, which the data plane does whenever the router's repository changes (a reload,
a new version).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.openai.chat_template import PLAIN, ChatTemplate, Renderer, load_chat_template
from conveyor.ingress.openai.contract import IDS_INPUT, TEXT_INPUT, TEXT_OUTPUT, Contract, contract_of
from conveyor.ingress.openai.errors import UnknownModel, unreadable
from conveyor.ingress.openai.tokenizer import PARAMETERS, Tokenizer, load_tokenizer, tokenizer_folder
from conveyor.ingress.openai.tools import PARSER_PARAMETER
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.lora import RUNTIME_PARAMETER, repository_adapters
from conveyor.proto.migration import PARAMETER as MIGRATIONS_PARAMETER
from conveyor.proto.migration import max_migrations_of
from conveyor.proto.repository_files import read_text
from conveyor.proto.signature import ModelSignature

# Triton's OpenAI frontend's owner of every model card (its clients and tests read it).
OWNER = "Triton Inference Server"


@dataclass
class LlmModel:
    name: str
    signature: ModelSignature
    contract: Contract
    directory: str
    adapters: dict[str, str]  # the repository's: name -> path
    created: int
    engine_args: dict[str, Any] = field(default_factory=dict)
    tool_parser: str = ""  # the config's TOOL_CALL_PARSER: how ``auto`` tool choice reads the text
    tokenizer_dir: str | None = None  # None: the model has no tokenizer
    runtime_lora: bool = False  # the config's ALLOW_RUNTIME_LORA_UPDATING: adapters may be loaded at run time
    max_migrations: int = 0  # MAX_MIGRATIONS: how often a request moves when its worker dies (0: never)
    steps: bool = False  # a vLLM model: its backend answers in steps, not tensors (proto/stream_steps.py)
    chat: asyncio.Task[ChatTemplate] | None = None
    tokenizer: asyncio.Task[Tokenizer | None] | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's ``model`` names: a model, and perhaps one of its adapters."""

    model: LlmModel
    adapter: str | None


@dataclass(frozen=True, slots=True)
class Listed:
    """One row of ``/v1/models``: a model (no parent) or an adapter of one."""

    id: str
    model: LlmModel
    parent: str | None = None
    root: str = ""


@dataclass(frozen=True, slots=True)
class Card:
    """One model card of ``/v1/models``: ``root`` is a model's weights or an adapter's folder, ``parent``
    an adapter's model (vLLM's fields); ``created``, when this ingress first saw that load of it."""

    id: str
    created: int
    root: str
    parent: str | None = None

    def doc(self) -> dict[str, object]:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": OWNER, "root": self.root,
                "parent": self.parent}


@dataclass(frozen=True, slots=True)
class RuntimeAdapter:
    model: str
    path: str


def model_not_found(name: str) -> ConveyorError:
    return UnknownModel(name)


class Catalog:
    def __init__(self, dataplane: DataPlane, lora_separator: str = "", tool_call_parser: str = "",
                 tokenizer: str = "") -> None:
        self._dataplane = dataplane
        self._separator = lora_separator
        self._tool_call_parser = tool_call_parser  # --tool-call-parser: a model's when its config names none
        self._tokenizer = tokenizer or None  # --tokenizer: the tokenizer folder of a model that names none
        self._models: dict[str, LlmModel] = {}
        self._templates: dict[str, asyncio.Task[ChatTemplate]] = {}  # by tokenizer folder: reloads reuse it
        self._tokenizers: dict[str, asyncio.Task[Tokenizer | None]] = {}  # the same
        self._runtime: dict[str, RuntimeAdapter] = {}  # adapters loaded at run time, by name
        self._runtime_generation = -2  # the router's generation they belong to (-2: not read)
        # The ready models that are not generative, listed too: the signature of the load seen, and when.
        self._others: dict[str, tuple[ModelSignature, int]] = {}

    async def target(self, name: str) -> Target:
        """The model (and adapter) ``name`` designates: a model, an adapter loaded at run time (by its
        name, as vLLM's server), or ``<model><separator><adapter>``; 404 for anything else."""
        try:
            return Target(await self.model(name), None)
        except ConveyorError as exc:
            if exc.status is not Status.NOT_FOUND:
                raise
        runtime = (await self.runtime_adapters()).get(name)
        if runtime is not None:
            return Target(await self.model(runtime.model, shown=name), name)
        if not self._separator or self._separator not in name:
            raise model_not_found(name)
        base, _, adapter = name.rpartition(self._separator)
        model = await self.model(base, shown=name)
        known = [*model.adapters, *(n for n, a in self._runtime.items() if a.model == base)]
        if adapter not in known:
            raise UnknownModel(name, f"The model `{name}` does not exist: '{base}' has no LoRA adapter '{adapter}'"
                               + (f" (it has {', '.join(known)})" if known else ""),
                               triton=f"Unknown LoRA: {adapter}; for model: {name}")
        return Target(model, adapter)

    async def runtime_adapters(self) -> dict[str, RuntimeAdapter]:
        """The adapters loaded at run time, read from the router once per repository generation."""
        if self._runtime_generation != self._dataplane.models.generation:
            reply = await self._dataplane.link.lora_adapters()
            self._runtime = {name: RuntimeAdapter(a["model"], a["path"]) for name, a in reply.adapters.items()}
            self._runtime_generation = reply.generation
        return self._runtime

    def forget_adapters(self) -> None:
        """This ingress loaded or unloaded one: read them again (the router's announcement may come later)."""
        self._runtime_generation = -2

    async def model(self, name: str, *, shown: str = "") -> LlmModel:
        try:
            sig = await self._dataplane.models.get(name, "")
        except ConveyorError as exc:
            if exc.status in (Status.NOT_FOUND, Status.UNAVAILABLE, Status.INVALID_ARG):
                raise model_not_found(shown or name) from None
            raise
        known = self._models.get(name)
        if known is not None and known.signature is sig:
            return known
        contract = contract_of(sig)
        if contract is None:
            # Listed (every ready model is), but no text goes in or out of it.
            raise invalid_arg(f"The model `{shown or name}` is not a text generation model: it has no BYTES "
                              f"'{TEXT_INPUT}' input and '{TEXT_OUTPUT}' output")
        directory = await self._dataplane.link.model_directory(name)
        config = await self._dataplane.link.model_config(name)
        model = _read_model(name, sig, contract, directory.path)
        model.tool_parser = _parameter(config, PARSER_PARAMETER) or self._tool_call_parser
        model.tokenizer_dir = tokenizer_folder(model.directory, model.engine_args,
                                               {k: _parameter(config, k) for k in PARAMETERS}) or self._tokenizer
        model.runtime_lora = _parameter(config, RUNTIME_PARAMETER).lower() in ("true", "1", "on")
        model.max_migrations = _max_migrations(config, sig)
        model.steps = config.get("backend") == "vllm"
        self._models[name] = model
        return model

    async def _ready(self) -> list[str]:
        index = await self._dataplane.link.repository_index(ready=True)
        return sorted({str(row["name"]) for row in index})

    async def models(self) -> list[LlmModel]:
        """Every ready generative model, by name."""
        out: list[LlmModel] = []
        for name in await self._ready():
            try:
                out.append(await self.model(name))
            except ConveyorError:
                continue
        return out

    async def cards(self) -> list[Card]:
        """``/v1/models``: every ready model, by name, as Triton's frontend lists each (a model that is not
        generative too: its clients and tests count them), each generative one followed by its adapters."""
        runtime = await self.runtime_adapters()
        out: list[Card] = []
        for name in await self._ready():
            try:
                model = await self.model(name)
            except ConveyorError:
                card = await self._other(name)
                out += [card] if card is not None else []
                continue
            out += [_model_card(row) for row in self._rows(model, runtime)]
        return out

    async def card(self, name: str) -> Card:
        """``/v1/models/{name}``: the card of a model (generative or not) or of an adapter (by its name)."""
        try:
            target = await self.target(name)
        except ConveyorError as exc:
            card = await self._other(name) if exc.status in (Status.NOT_FOUND, Status.INVALID_ARG) else None
            if card is None:
                raise
            return card
        model, adapter = target.model, target.adapter
        if adapter is None:
            return _model_card(Listed(name, model))
        runtime = (await self.runtime_adapters()).get(adapter)
        return _model_card(Listed(name, model, model.name,
                                  runtime.path if runtime is not None else model.adapters[adapter]))

    async def _other(self, name: str) -> Card | None:
        """A ready model that is not generative; None if ``name`` names no ready model."""
        try:
            sig = await self._dataplane.models.get(name, "")
        except ConveyorError:
            return None
        seen = self._others.get(name)
        if seen is None or seen[0] is not sig:
            seen = self._others[name] = (sig, int(time.time()))
        return Card(name, seen[1], name)

    async def listed(self) -> list[Listed]:
        """Every ready generative model, then each of its repository's adapters
        (``<model><separator><adapter>``, with a separator) and those loaded at run time (by name)."""
        runtime = await self.runtime_adapters()
        return [row for model in await self.models() for row in self._rows(model, runtime)]

    def _rows(self, model: LlmModel, runtime: dict[str, RuntimeAdapter]) -> list[Listed]:
        out = [Listed(model.name, model)]
        if self._separator:
            out += [Listed(f"{model.name}{self._separator}{a}", model, model.name, path)
                    for a, path in model.adapters.items()]
        out += [Listed(n, model, model.name, a.path) for n, a in runtime.items() if a.model == model.name]
        return out

    async def chat_template(self, model: LlmModel) -> Renderer:
        """The model's chat template, read once in a thread; a plain transcript without a tokenizer."""
        source = model.tokenizer_dir
        if source is None:
            return PLAIN
        if model.chat is None or (model.chat.done() and model.chat.exception() is not None):
            task = self._templates.get(source)
            if task is None or (task.done() and task.exception() is not None):
                task = asyncio.ensure_future(asyncio.to_thread(load_chat_template, source))
                self._templates[source] = task
            model.chat = task
        return await model.chat

    async def tokenizer(self, model: LlmModel) -> Tokenizer | None:
        """The model's tokenizer, read once in a thread; None when it has none (no ``tokenizer.json``)."""
        source = model.tokenizer_dir
        if source is None:
            return None
        if model.tokenizer is None or (model.tokenizer.done() and model.tokenizer.exception() is not None):
            task = self._tokenizers.get(source)
            if task is None or (task.done() and task.exception() is not None):
                task = asyncio.ensure_future(asyncio.to_thread(load_tokenizer, source, model.engine_args))
                self._tokenizers[source] = task
            model.tokenizer = task
        return await model.tokenizer


def _model_card(row: Listed) -> Card:
    """vLLM's card: an adapter names its base model in ``parent`` and its folder in ``root``; a model's
    ``root`` is its weights (``model.json``'s ``model``)."""
    return Card(row.id, row.model.created, row.root or str(row.model.engine_args.get("model") or row.model.name),
                row.parent)


def _read_model(name: str, sig: ModelSignature, contract: Contract, directory: str) -> LlmModel:
    engine_args = _json_file(os.path.join(directory, "model.json")) or {}
    adapters = repository_adapters(directory) if str(engine_args.get("enable_lora", "")).lower() == "true" else None
    return LlmModel(name, sig, contract, directory, adapters or {}, int(time.time()), engine_args)


def _max_migrations(config: dict[str, Any], sig: ModelSignature) -> int:
    """``MAX_MIGRATIONS`` of a vLLM model (whose backend returns the token ids a resumed prompt is made
    of, and takes them as ``input_ids``); 0 for any other model, whose requests do not move."""
    if config.get("backend") != "vllm" or IDS_INPUT not in sig.inputs:
        return 0
    return max(0, max_migrations_of(_parameter(config, MIGRATIONS_PARAMETER)))  # a bad value does not load


def _parameter(config: dict[str, Any], key: str) -> str:
    """A ``parameters { key value { string_value } }`` of the model's config (JSON form)."""
    value = (config.get("parameters") or {}).get(key) or {}
    return str(value.get("string_value") or "").strip() if isinstance(value, dict) else ""


def _json_file(path: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(read_text(path))  # never a FIFO's wait (proto/repository_files.py)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise unreadable(path, exc) from None
    return doc if isinstance(doc, dict) else None
