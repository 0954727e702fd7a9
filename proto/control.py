"""The router's control plane, typed: each op's argument struct (which the router checks a
``ControlRequest``'s ``args`` against, router/control_ops.py), the ``RouterClient`` protocol
with one method per op, and ``ControlCalls``, which maps each method onto its op.

The wire stays ``ControlRequest(id, op, args: dict)``: each method sends its op's name and
its arguments by keyword, as the ingresses always have. A result the ingress reads is
decoded into a small struct here; one it hands to its client as the router wrote it
(metadata, config, statistics, settings, index rows) stays a dict or a list of them.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

CONTROL_TIMEOUT_S = 30.0
# A model load answers once the model is ready: big models take a while.
LOAD_TIMEOUT_S = 600.0
# The router answers a LoRA load within its own 120 s (router/runtime_lora.py), once every instance answered.
LORA_LOAD_TIMEOUT_S = 180.0


# --- the ops' arguments (the router's ``ControlTable`` converts ``args`` into these) -------


class Args(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An op's arguments: a keyword the op does not take is an error, as a missing one is."""


class NoArgs(Args, frozen=True):
    pass


class ModelVersion(Args, frozen=True):
    model: str
    version: str = ""  # "": the latest ready one (or all, for the statistics)


class AnyModel(Args, frozen=True):
    model: str = ""  # "": every model
    version: str = ""


class LoraLoad(Args, frozen=True):
    model: str
    name: str
    path: str
    inplace: bool = False  # replace a runtime adapter of that name (vLLM's ``load_inplace``)


class LoraUnload(Args, frozen=True):
    name: str


class RepositoryIndex(Args, frozen=True):
    ready: bool = False  # only the ready models


class RepositoryLoad(Args, frozen=True):
    model: str = ""
    config: str = ""  # a model config (JSON) overriding the repository's
    files: dict[str, bytes] | None = None  # "<version>/<name>" -> contents, with ``config``
    frontend: bool = False  # Triton's OpenAI frontend's load: refused for a model loaded (lifecycle/calls.py)


class RepositoryUnload(Args, frozen=True):
    model: str = ""
    unload_dependents: bool = False  # the ensembles using it too
    frontend: bool = False  # Triton's OpenAI frontend's unload: refused for a model not loaded


class RepositoryRegister(Args, frozen=True):
    root: str
    mapping: dict[str, str]  # subdirectory -> model name


class RepositoryUnregister(Args, frozen=True):
    root: str


class ShmRegister(Args, frozen=True):
    kind: str  # "system" or "cuda"
    name: str
    byte_size: int
    key: str = ""  # system: the POSIX segment
    offset: int = 0
    handle: bytes = b""  # cuda: the IPC handle
    device_id: int = 0


class ShmRegion(Args, frozen=True):
    kind: str
    name: str = ""  # "": every region of that kind


class LogSettings(Args, frozen=True):
    settings: dict[str, Any] | None = None  # None: read them


class TraceSettings(Args, frozen=True):
    model: str = ""  # "": the global settings
    settings: dict[str, Any] | None = None  # None: read them


# --- the results the ingress reads --------------------------------------------------------


class SignatureReply(msgspec.Struct, frozen=True):
    generation: int  # the router's repository generation: the ingress keeps the signature until it changes
    signature: dict[str, Any]  # ``ModelSignature.from_wire``


class ModelDirectory(msgspec.Struct, frozen=True):
    generation: int
    path: str  # <repository>/<model>/<version>
    version: int


class LoraAnswer(msgspec.Struct, frozen=True):
    message: str  # what the OpenAI endpoint answers, as vLLM words it
    model: str = ""  # lora_unload: the adapter's base model


class LoraAdapters(msgspec.Struct, frozen=True):
    generation: int
    adapters: dict[str, dict[str, str]]  # name -> {"model", "path"}


# --- the client ---------------------------------------------------------------------------


class RouterClient(Protocol):
    """What an ingress asks the router outside inference: one method per control op (the
    router's table, router/control_ops.py); an error is the router's ``ConveyorError``."""

    async def ping(self) -> tuple[int, int]:
        """(the router's boot id, its pid)."""
        ...

    async def server_ready(self) -> bool: ...
    async def model_ready(self, model: str, version: str = "") -> bool: ...
    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def model_stats(self, model: str = "", version: str = "") -> dict[str, Any]: ...
    async def signature(self, model: str, version: str = "") -> SignatureReply: ...
    async def metrics(self) -> dict[str, Any]: ...
    async def instances(self) -> list[dict[str, Any]]: ...
    async def model_directory(self, model: str, version: str = "") -> ModelDirectory: ...
    async def model_load(self, model: str, version: str = "") -> dict[str, float]: ...
    async def repository_index(self, ready: bool = False) -> list[dict[str, Any]]: ...

    async def repository_load(self, model: str = "", config: str = "",
                              files: dict[str, bytes] | None = None, frontend: bool = False) -> None: ...

    async def repository_unload(self, model: str = "", unload_dependents: bool = False,
                                frontend: bool = False) -> None: ...
    async def repository_register(self, root: str, mapping: dict[str, str]) -> None: ...
    async def repository_unregister(self, root: str) -> None: ...
    async def lora_load(self, model: str, name: str, path: str, inplace: bool = False) -> LoraAnswer: ...
    async def lora_unload(self, name: str) -> LoraAnswer: ...
    async def lora_adapters(self) -> LoraAdapters: ...

    async def shm_register(self, kind: str, name: str, byte_size: int, key: str = "", offset: int = 0,
                           handle: bytes = b"", device_id: int = 0) -> None: ...

    async def shm_unregister(self, kind: str, name: str = "") -> None: ...
    async def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]: ...
    async def log_settings(self, settings: dict[str, Any] | None = None) -> dict[str, Any]: ...

    async def trace_settings(self, model: str = "",
                             settings: dict[str, Any] | None = None) -> dict[str, Any]: ...

    async def held_blocks(self) -> dict[str, int]: ...
    async def transport(self) -> dict[str, int]: ...


class ControlCalls:
    """``RouterClient`` over one ``_control(op, args, timeout_s)`` that sends a ``ControlRequest``
    and returns its result (``RouterLink``: over ZeroMQ; the tests' stand-ins: from a table).

    Each method sends the keywords its op's struct names, an optional one only when given
    (a read of the settings sends none), as the untyped calls did."""

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        raise NotImplementedError

    async def ping(self) -> tuple[int, int]:
        boot, pid = await self._control("ping", {}, CONTROL_TIMEOUT_S)
        return int(boot), int(pid)

    async def server_ready(self) -> bool:
        return bool(await self._control("server_ready", {}, CONTROL_TIMEOUT_S))

    async def model_ready(self, model: str, version: str = "") -> bool:
        return bool(await self._control("model_ready", {"model": model, "version": version}, CONTROL_TIMEOUT_S))

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._control("model_metadata", {"model": model, "version": version}, CONTROL_TIMEOUT_S)

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._control("model_config", {"model": model, "version": version}, CONTROL_TIMEOUT_S)

    async def model_stats(self, model: str = "", version: str = "") -> dict[str, Any]:
        return await self._control("model_stats", {"model": model, "version": version}, CONTROL_TIMEOUT_S)

    async def signature(self, model: str, version: str = "") -> SignatureReply:
        reply = await self._control("signature", {"model": model, "version": version}, CONTROL_TIMEOUT_S)
        return msgspec.convert(reply, SignatureReply)

    async def metrics(self) -> dict[str, Any]:
        return await self._control("metrics", {}, CONTROL_TIMEOUT_S)

    async def instances(self) -> list[dict[str, Any]]:
        return await self._control("instances", {}, CONTROL_TIMEOUT_S)

    async def model_directory(self, model: str, version: str = "") -> ModelDirectory:
        reply = await self._control("model_directory", {"model": model, "version": version}, CONTROL_TIMEOUT_S)
        return msgspec.convert(reply, ModelDirectory)

    async def model_load(self, model: str, version: str = "") -> dict[str, float]:
        return await self._control("model_load", {"model": model, "version": version}, CONTROL_TIMEOUT_S)

    async def repository_index(self, ready: bool = False) -> list[dict[str, Any]]:
        return await self._control("repository_index", {"ready": ready}, CONTROL_TIMEOUT_S)

    async def repository_load(self, model: str = "", config: str = "", files: dict[str, bytes] | None = None,
                              frontend: bool = False) -> None:
        args: dict[str, Any] = {"model": model, "config": config}
        if files is not None:
            args["files"] = files
        if frontend:
            args["frontend"] = True
        await self._control("repository_load", args, LOAD_TIMEOUT_S)

    async def repository_unload(self, model: str = "", unload_dependents: bool = False,
                                frontend: bool = False) -> None:
        args: dict[str, Any] = {"model": model, "unload_dependents": unload_dependents}
        if frontend:
            args["frontend"] = True
        await self._control("repository_unload", args, CONTROL_TIMEOUT_S)

    async def repository_register(self, root: str, mapping: dict[str, str]) -> None:
        await self._control("repository_register", {"root": root, "mapping": mapping}, CONTROL_TIMEOUT_S)

    async def repository_unregister(self, root: str) -> None:
        await self._control("repository_unregister", {"root": root}, CONTROL_TIMEOUT_S)

    async def lora_load(self, model: str, name: str, path: str, inplace: bool = False) -> LoraAnswer:
        reply = await self._control("lora_load", {"model": model, "name": name, "path": path, "inplace": inplace},
                                    LORA_LOAD_TIMEOUT_S)
        return msgspec.convert(reply, LoraAnswer)

    async def lora_unload(self, name: str) -> LoraAnswer:
        return msgspec.convert(await self._control("lora_unload", {"name": name}, CONTROL_TIMEOUT_S), LoraAnswer)

    async def lora_adapters(self) -> LoraAdapters:
        return msgspec.convert(await self._control("lora_adapters", {}, CONTROL_TIMEOUT_S), LoraAdapters)

    async def shm_register(self, kind: str, name: str, byte_size: int, key: str = "", offset: int = 0,
                           handle: bytes = b"", device_id: int = 0) -> None:
        # A region of each kind sends its own keywords only (the others' defaults are the router's too).
        if kind == "cuda":
            args = {"kind": kind, "name": name, "byte_size": byte_size, "handle": handle, "device_id": device_id}
        else:
            args = {"kind": kind, "name": name, "byte_size": byte_size, "key": key, "offset": offset}
        await self._control("shm_register", args, CONTROL_TIMEOUT_S)

    async def shm_unregister(self, kind: str, name: str = "") -> None:
        await self._control("shm_unregister", {"kind": kind, "name": name}, CONTROL_TIMEOUT_S)

    async def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        return await self._control("shm_status", {"kind": kind, "name": name}, CONTROL_TIMEOUT_S)

    async def log_settings(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        args = {} if settings is None else {"settings": settings}
        return await self._control("log_settings", args, CONTROL_TIMEOUT_S)

    async def trace_settings(self, model: str = "", settings: dict[str, Any] | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"model": model}
        if settings is not None:
            args["settings"] = settings
        return await self._control("trace_settings", args, CONTROL_TIMEOUT_S)

    async def held_blocks(self) -> dict[str, int]:
        return await self._control("held_blocks", {}, CONTROL_TIMEOUT_S)

    async def transport(self) -> dict[str, int]:
        return await self._control("transport", {}, CONTROL_TIMEOUT_S)
