"""``VllmBackend``: a decoupled ``RequestBackend`` whose execute hands each request to the engine.

Each request becomes a task on the engine's loop that streams the engine's outputs back through the
request's response channel; a cancel (client gone, gRPC cancel) cancels that task, which aborts the
request in the engine. Errors of one request (bad parameters, unknown adapter) end only that request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import threading
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, WorkerLost, internal, invalid_arg, not_found, unavailable
from conveyor.proto.lora import runtime_updates_allowed
from conveyor.proto.repository_files import read_text, unreadable
from conveyor.proto.stream_steps import STEP
from conveyor.workers.backends.base import (
    ParameterizedOutputs,
    RequestItem,
    RequestOutcome,
    ResponseChannel,
    WireTensor,
)
from conveyor.workers.backends.vllm import embedding, kv_events, media, outputs
from conveyor.workers.backends.vllm.cached_prefixes import CachedPrefixes
from conveyor.workers.backends.vllm.engine import EngineLoop
from conveyor.workers.backends.vllm.lora import LoraRepository
from conveyor.workers.backends.vllm.metrics import stat_logger_factory
from conveyor.workers.backends.vllm.placement import engine_on_compute_cores
from conveyor.workers.backends.vllm.priority import engine_nice
from conveyor.workers.backends.vllm.request import GenerateArgs, engine_prompt, parse, prefix_keys, sampling_params
from conveyor.workers.loop_replies import LoopReplies
from conveyor.workers.stopping import fatal_exit, in_worker

log = logging.getLogger(__name__)

ENGINE_ARGS = "model.json"
# Triton's vllm_backend words, for requests to a model whose engine died (ENABLE_VLLM_HEALTH_CHECK).
UNHEALTHY = "Model is unavailable due to unhealthy vLLM engine"
# "false": the engines of a model with several do not publish their KV-cache events, and the router
# places by its own record only (docs/LLM.md).
KV_EVENTS_PARAMETER = "KV_CACHE_EVENTS"
# Triton's vllm_backend's log lines (INFO) around a cancelled request's abort, which its CI reads in the log.
CANCELLING_LOG = "[vllm] Cancelling the request"
CANCELLED_LOG = "[vllm] Successfully cancelled the request"
REPORT_PARAMETER = "REPORT_CUSTOM_METRICS"  # "true": the engine's vllm: metrics on /metrics (default off)
KV_LIMIT_PARAMETER = "MAX_KV_CACHE_USAGE"  # router/scheduling/overload.py's limit, read from this engine's reports


def several_engines(config: mc.ModelConfig) -> bool:
    """Whether the model may run more than one engine: an ``instance_group`` of more than one
    instance, or none (an engine on every worker). Their metrics then say which engine they are;
    a single engine's are labelled as Triton's vllm_backend labels them (model and version only)."""
    groups = config.instance_group
    return not groups or sum(max(g.count, 1) * max(len(g.gpus), 1) for g in groups) > 1  # count on each GPU listed


def kv_events_wanted(config: mc.ModelConfig) -> bool:
    """Whether the engine tells the router what its cache evicts: where the model may run several engines
    (placement by prefix reads it), unless ``KV_CACHE_EVENTS`` is "false"."""
    return several_engines(config) and (_parameter(config, KV_EVENTS_PARAMETER) or "true").lower() != "false"


def _parameter(config: mc.ModelConfig, name: str) -> str | None:
    p = config.parameters.get(name)
    return None if p is None else p.string_value


class VllmBackend:
    def __init__(self, path: str, config: mc.ModelConfig, device: str, instance_name: str = "", instance: int = 0,
                 post: Callable[[bytes], None] | None = None) -> None:
        """``path``: ``<model>/<version>/model.json``; ``instance_name``: Triton's name of the instance,
        the ``engine`` label of its metrics when the model may have several engines; ``instance``: the
        router's number of it; ``post``: sends a message to the router from any thread (a worker's)."""
        self.name = config.name
        if not config.model_transaction_policy.decoupled:
            raise unavailable("vLLM Triton backend must be configured to use decoupled model transaction policy")
        version_dir = os.path.dirname(os.path.abspath(path))
        try:
            engine_args = json.loads(read_text(path))
        except FileNotFoundError:
            raise unavailable(f"'{ENGINE_ARGS}' containing vllm engine args must be provided in "
                              f"'{version_dir}'") from None
        except OSError as exc:  # a FIFO, a device, a directory: refused, never waited on
            raise unavailable(unreadable(path, exc)) from None
        except ValueError as exc:
            raise unavailable(f"'{path}' is not valid JSON: {exc}") from None
        if not isinstance(engine_args, dict):
            raise unavailable(f"'{path}' must hold a JSON object of vLLM engine arguments")
        # KIND_GPU: the engine uses the instance's GPU only (as Triton)
        environment = {"CUDA_VISIBLE_DEVICES": device.split(":", 1)[1]} if device.startswith("cuda:") else {}
        self.loras = LoraRepository.load(version_dir, engine_args, runtime_updates_allowed(config))
        self.health_check = (_parameter(config, "ENABLE_VLLM_HEALTH_CHECK") or "false").lower() == "true"
        self._tasks: list[asyncio.Task[None]] = []  # the engine loop's own (its events' reader)
        self.healthy = True  # ENABLE_VLLM_HEALTH_CHECK: false once the engine died (then the model unloads)
        # As Triton's vllm_backend: the vllm: metrics only when REPORT_CUSTOM_METRICS is "true". A model
        # that limits its KV-cache use still reports that use alone: the router's limit reads it.
        report = (_parameter(config, REPORT_PARAMETER) or "").lower() == "true"
        kv_limited = bool(_parameter(config, KV_LIMIT_PARAMETER))
        loggers: list[Any] = []
        if (report or kv_limited) and not engine_args.get("disable_log_stats", False):
            labels = {"model": config.name, "version": os.path.basename(version_dir)}
            if instance_name and several_engines(config):
                labels["engine"] = instance_name
            loggers.append(stat_logger_factory(labels, kv_only=not report))
        nice = engine_nice(_parameter(config, "ENGINE_NICE"))
        on_compute_cores = engine_on_compute_cores(_parameter(config, "ENGINE_CPUS"))
        events: kv_events.Endpoints | None = None
        if post is not None and kv_events_wanted(config) and kv_events.supported():
            engine_args, events = kv_events.engine_args(engine_args)
        self.events = events
        self.prefixes: CachedPrefixes | None = None
        try:
            self.engine = EngineLoop(config.name, engine_args, loggers, nice, on_compute_cores, environment,
                                     self._engine_died)
        except ConveyorError:
            raise
        except Exception as exc:
            log.exception("the vLLM engine of '%s' failed to start", self.name)
            why = f"{type(exc).__name__}: {exc}"
            raise unavailable(f"failed to start the vLLM engine of '{self.name}': {why}") from None
        # The images one prompt may hold: the engine's limit_mm_per_prompt; 0 for a text-only model.
        model_config = self.engine.engine.model_config
        mm = model_config.multimodal_config if model_config.is_multimodal_model else None
        self.image_limit: int = mm.get_limit_per_prompt("image") if mm is not None else 0
        # Tokens leave from the engine's thread, an engine step's worth per message (not via the main loop).
        self.replies = LoopReplies(self.engine.loop)
        if events is not None and post is not None:
            self._follow_cache(events, post, os.path.basename(version_dir), instance)

    def _follow_cache(self, events: kv_events.Endpoints, post: Callable[[bytes], None], version: str,
                      instance: int) -> None:
        """Read the engine's KV-cache events on its loop; tell the router the prefixes it evicts."""
        name = self.name
        tokenizer = self.engine.engine.tokenizer

        def decode(ids: list[int]) -> str:
            return "" if tokenizer is None else str(tokenizer.decode(ids, skip_special_tokens=True))

        def report(keys: list[int], everything: bool) -> None:
            post(m.encode(m.PrefixesEvicted(name, version, instance, keys, everything)))

        prefixes = self.prefixes = CachedPrefixes(decode, report)
        stream = kv_events.EventStream(events, prefixes.on_events, prefixes.lost)
        self.engine.call(lambda: self._tasks.append(self.engine.loop.create_task(stream.run())))

    @property
    def reports_evictions(self) -> bool:
        """Its engine says what its cache evicts: the router may trust its record of it longer."""
        return self.prefixes is not None

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        if self.health_check and not self.healthy:
            for item in items:
                assert item.channel is not None
                item.channel.fail(ConveyorError(Status.UNAVAILABLE, UNHEALTHY))
            return []
        begins: list[Callable[[], None]] = []
        channels: list[ResponseChannel] = []
        for item in items:
            channel = item.channel
            assert channel is not None  # decoupled: every request has one
            work: Callable[[], Awaitable[None]]
            try:
                if embedding.EMBEDDING_INPUT in item.inputs:
                    self._check_task(embedding.EMBED_TASK)
                    embed = embedding.parse(item)
                    work = functools.partial(self._embed, embed, channel)
                else:
                    self._check_task(embedding.GENERATE_TASK)
                    args = parse(item)
                    if args.lora_name is not None:
                        self.loras.check(args.lora_name)
                    if args.images:
                        media.check_engine(len(args.images), self.image_limit, self.name)
                        args.pictures = media.decode(args.images)
                    keys = prefix_keys(item, args) if self.prefixes is not None else None
                    work = functools.partial(self._generate, args, channel, keys)
            except ConveyorError as exc:
                channel.fail(exc)
                continue
            begins.append(self._start(work, channel))
            channels.append(channel)
        if self.health_check:  # Triton's backend asks the engine before each batch, whatever the batch holds
            self.engine.run(self._check_health(begins, channels)).add_done_callback(_log_failure)
        elif begins:
            self.engine.call(lambda: _begin_all(begins))
        return []

    def _check_task(self, task: str) -> None:
        """A pooling engine embeds and a generative one generates; each refuses the other's requests
        (as Triton's backend, before the engine sees them)."""
        if task not in self.engine.supported_tasks:
            raise embedding.task_refused(self.name, task)

    async def _check_health(self, begins: list[Callable[[], None]], channels: list[ResponseChannel]) -> None:
        """ENABLE_VLLM_HEALTH_CHECK, as Triton's vllm_backend: before each batch, the engine's ``check_health()``
        (on the engine's loop, where Triton's backend waits for it on the thread of its ``execute``: the
        worker's loop never waits). The batch's requests start once it returned; if it raised, they fail as
        UNAVAILABLE in Triton's words and the model is unloaded (``_unhealthy``). An engine that died (its
        core process ended) is mostly seen sooner: ``_engine_died``."""
        try:
            if self.healthy:
                await self.engine.engine.check_health()
        except Exception:
            if self.engine.dead:  # logged, and the model unloaded, by ``_engine_died``
                self.healthy = False
                self.engine.died(self.engine.dead_reason)
            else:
                self._unhealthy(traceback.format_exc().rstrip())
        if not self.healthy:
            for channel in channels:
                channel.reply_from(self.replies)  # answered from this loop, as ``_serve`` answers
                channel.fail(ConveyorError(Status.UNAVAILABLE, UNHEALTHY))
            return
        _begin_all(begins)

    def _unhealthy(self, why: str) -> None:
        """The engine's ``check_health()`` failed (its engine alive): the model is unloaded, as Triton's
        backend unloads it, on a thread of its own (the unload waits for the router); until then, and for
        good where the control mode lets no model unload, its requests fail as UNAVAILABLE."""
        if not self.healthy:
            return
        self.healthy = False
        log.error("[vllm] Engine is not healthy and model will be unloaded: %s", why)
        threading.Thread(target=_unload, args=(self.name,), name=f"vllm-unload-{self.name}", daemon=True).start()

    def _engine_died(self, why: str) -> None:
        """The engine died while serving (``EngineLoop.died``; on a thread of its own). Its model must not
        stay ready with an engine that answers nothing but errors. With ENABLE_VLLM_HEALTH_CHECK, as Triton's
        vllm_backend: the model is unloaded, its requests until then failing as UNAVAILABLE in Triton's words.
        Otherwise, and where the control mode lets no model unload: the worker exits, and restarts with its
        models loaded again (``workers/stopping.py``), as after any worker's death."""
        if self.health_check:
            self.healthy = False
            log.error("[vllm] Engine is not healthy and model will be unloaded: %s", why)
            if _unload(self.name):
                return
        fatal_exit(f"the vLLM engine of '{self.name}' died: {why}")

    def _start(self, work: Callable[[], Awaitable[None]], channel: ResponseChannel) -> Callable[[], None]:
        """What starts the request on the engine's loop (called there); its cancel hook set now."""
        holder: list[asyncio.Task[None]] = []

        def cancel() -> None:  # on the worker's main thread
            self.engine.call(lambda: _cancel(holder[0]) if holder else None)

        def begin() -> None:  # on the engine's loop
            channel.reply_from(self.replies)
            holder.append(self.engine.loop.create_task(self._serve(work, channel)))

        channel.add_cancel_hook(cancel)
        return begin

    async def _generate(self, args: GenerateArgs, channel: ResponseChannel,
                        keys: tuple[list[int], bool] | None) -> None:
        """``keys``: the prompt's prefix keys, and whether of token ids, where the engine's cache is followed."""
        params = sampling_params(args.sampling, final_only=not args.stream)
        state = outputs.ResponseState(params.n, self._decode)
        lora = self.loras.request(args.lora_name) if args.lora_name is not None else None
        prompt = engine_prompt(args.prompt, args.pictures)
        resumable = args.stream and args.token_ids and params.n == 1
        answer = self._steps if args.steps else self._tensors
        request_id = uuid.uuid4().hex
        prefixes = self.prefixes
        extra: dict[str, Any] = {}
        if prefixes is not None and keys is not None and keys[0]:
            prefixes.begin(request_id, *keys)
            extra["session_id"] = request_id  # on the events of the blocks the engine stores for it
        try:
            async for out in self.engine.engine.generate(prompt, params, request_id, lora_request=lora,
                                                         priority=args.priority, **extra):
                state.merge(out)
                if args.stream:
                    channel.send(answer(state, False, args.returns, resumable), out.finished)
        finally:
            if extra:
                prefixes.end(request_id)  # type: ignore[union-attr]
        if not args.stream:
            channel.send(answer(state, args.prepend_input, args.returns, False), True)
        elif not channel.closed:
            channel.send(None, True)

    @staticmethod
    def _tensors(state: outputs.ResponseState, prepend: bool, returns: frozenset[str],
                 resumable: bool) -> Mapping[str, WireTensor | np.ndarray]:
        """A response of Triton's contract: its outputs as tensors."""
        if not resumable:
            return outputs.build(state, prepend, returns)
        # the token ids ride along as response parameters, never shown to a client
        sent: dict[str, Any] = ParameterizedOutputs(outputs.token_ids(state))
        sent.update(outputs.build(state, prepend, returns))
        return sent

    @staticmethod
    def _steps(state: outputs.ResponseState, prepend: bool, returns: frozenset[str],
               resumable: bool) -> ParameterizedOutputs:
        """A response to the OpenAI ingress: no tensors, the step in its parameters."""
        parameters: dict[str, Any] = outputs.token_ids(state) if resumable else {}
        parameters[STEP] = outputs.step(state, prepend, returns)
        return ParameterizedOutputs(parameters)

    def _decode(self, token: int) -> str:
        """A token's text as vLLM's server shows a prompt's first token (its tokenizer's ``decode``)."""
        tokenizer = self.engine.engine.tokenizer
        return "" if tokenizer is None else str(tokenizer.decode([token]))

    async def _embed(self, args: embedding.EmbedArgs, channel: ResponseChannel) -> None:
        """One prompt's vector: the engine pools once and answers once (vLLM's ``FINAL_ONLY``)."""
        final = None
        params = embedding.pooling_params(args)
        async for out in self.engine.engine.encode(embedding.engine_prompt(args), params, uuid.uuid4().hex):
            final = out
        if final is None:
            raise internal("the engine finished the embedding request without an output")
        channel.send(embedding.build(final, args.returns), True)

    async def _serve(self, work: Callable[[], Awaitable[None]], channel: ResponseChannel) -> None:
        """Run one request's ``work`` on the engine's loop; whatever ends it, its channel is answered."""
        try:
            if channel.cancelled:
                raise asyncio.CancelledError
            await work()
        except asyncio.CancelledError:  # the engine's generate aborted the request as it was cancelled
            if channel.cancelled:
                log.info(CANCELLED_LOG)
            channel.fail(ConveyorError(Status.CANCELLED, "Request was cancelled"))
        except ConveyorError as exc:
            channel.fail(exc)
        except Exception as exc:
            if _refused_by_engine(exc):  # the request's fault (a schema the engine cannot compile): 400
                channel.fail(invalid_arg(str(exc)))
                return
            if self.engine.dead:  # the engine died under this request
                self.engine.died(self.engine.dead_reason)
                if self.health_check:
                    self.healthy = False
                    channel.fail(ConveyorError(Status.UNAVAILABLE, UNHEALTHY))
                elif not in_worker():  # no worker to exit and have the router answer it as a dead worker's
                    channel.fail(WorkerLost(f"the vLLM engine of '{self.name}' running this request died"))
                # Else unanswered here: the worker exits, and the router answers it as its dead worker's
                # (``worker_lost``), once it no longer sends this model's requests here.
                return
            log.warning("vLLM request of '%s' failed", self.name, exc_info=True)
            channel.fail(internal(f"Error generating stream: {exc}"))

    def update_adapter(self, name: str, path: str) -> concurrent.futures.Future[None]:
        """A runtime adapter added (given to the engine, which loads it now: a bad path fails here,
        not in a request) or, ``path`` "", removed. Called on the worker's main thread, before any
        batch the router sent after it; done (or failed with a ``ConveyorError``) on the engine's."""
        if not path:
            lora_id = self.loras.remove(name)
            return self.engine.run(self._remove(lora_id))
        try:
            lora = self.loras.add(name, path)
        except ConveyorError as exc:
            failed: concurrent.futures.Future[None] = concurrent.futures.Future()
            failed.set_exception(exc)
            return failed
        return self.engine.run(self._add(lora))

    async def _add(self, lora: Any) -> None:
        try:
            await self.engine.engine.add_lora(lora)
        except Exception as exc:
            if self.loras.paths.get(lora.lora_name) == lora.lora_path:  # not replaced meanwhile
                self.loras.remove(lora.lora_name)
            raise _adapter_error(lora.lora_name, lora.lora_path, exc) from None

    async def _remove(self, lora_id: int | None) -> None:
        if lora_id is not None:
            await self.engine.engine.remove_lora(lora_id)

    def close(self) -> None:
        self.engine.call(self.replies.close)  # before the shutdown: the loop runs them in order
        self.engine.close()
        if self.events is not None:
            kv_events.remove_sockets(self.events)


def _cancel(task: asyncio.Task[None]) -> None:
    """A request's client cancelled it: its task ends, and the engine aborts it (on the engine's loop)."""
    if not task.done():
        log.info(CANCELLING_LOG)
        task.cancel()


def _log_failure(done: concurrent.futures.Future[None]) -> None:
    """What went wrong in a batch's start on the engine's loop, logged as the loop logs a failed callback."""
    if not done.cancelled() and done.exception() is not None:
        log.error("starting a batch of vLLM requests failed", exc_info=done.exception())


def _begin_all(begins: list[Callable[[], None]]) -> None:
    for begin in begins:
        begin()


def _refused_by_engine(exc: Exception) -> bool:
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # a vLLM before its client errors: every failure stays INTERNAL
        return False
    return isinstance(exc, VLLMClientError)


def _adapter_error(name: str, path: str, exc: Exception) -> ConveyorError:
    """vLLM's server's answers to a failed load: 404 with its wording when nothing is at the path
    (the engine core's error arrives as text), 500 with the engine's reason otherwise."""
    if "No adapter found for" in str(exc):
        return not_found(f"Loading lora {name} failed: No adapter found for {path}")
    return internal(str(exc) or type(exc).__name__)


def _unload(model: str) -> bool:
    """Ask the router to unload ``model`` (through the worker's BLS link, as ``pb_utils.unload_model``); whether
    it did."""
    from conveyor.workers.backends.python.pb_utils.model_control import unload_model

    try:
        unload_model(model)
    except Exception as exc:  # polling or no control mode (Triton's model would stay, answering UNAVAILABLE)
        log.warning("[vllm] the unhealthy model '%s' could not be unloaded: %s", model, exc)
        return False
    return True
