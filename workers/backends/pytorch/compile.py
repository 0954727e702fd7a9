"""``torch.compile`` for a TorchScript model, at load (``conveyor.torch_compile``).

Dynamo refuses a ScriptModule, so the module is first turned into an FX graph
over the same weight tensors by torch's TorchScript converter
(``torch._export.converter.TS2EPConverter``, traced on sample inputs shaped as
the config says), and that graph is what torch.compile compiles. The compiled
graph is then called on a few sample shapes, so that compiling happens during
the load and not on the first requests, and each answer is checked against the
TorchScript module's on the same inputs: a conversion that changed what the
model computes fails the compile instead of answering wrongly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.workers.backends.pytorch.compile_settings import CompileSettings

# Sizes the variable dimensions (the batch, -1 dims) take in the calls at load, in
# order. Dynamo compiles the first shape statically; in its automatic mode a second
# size recompiles the graph with dynamic sizes; sizes 1 (and 0) always get their own
# graph. So these cover every later size, except where ``dynamic`` is false (one
# compile per shape: ``model_warmup`` samples run after this can warm more).
WARM_SIZES: dict[bool | None, tuple[int, ...]] = {None: (2, 3, 1), True: (2, 1), False: (2, 1)}
TRACE_SIZE = 2  # the converter would fix a dimension it saw at size 1 to 1
# Conversion is tracing with process-wide state (fake tensor modes): one model at a time.
_LOCK = threading.Lock()


class CompileFailed(Exception):
    """Why a model could not be compiled: the load fails with it, or (``auto``) serves uncompiled."""


class CompiledModel:
    """The compiled graph, answering as the TorchScript module does (a tuple where it
    returns one: the converted graph returns lists)."""

    __slots__ = ("_cuda_graphs", "_fn", "_torch", "_tuple")

    def __init__(self, torch: Any, fn: Callable[..., Any], returns_tuple: bool, cuda_graphs: bool) -> None:
        self._torch, self._fn, self._tuple, self._cuda_graphs = torch, fn, returns_tuple, cuda_graphs

    def __call__(self, *args: Any) -> Any:
        if self._cuda_graphs:
            # A CUDA graph's outputs live in its pool and the next replay overwrites them;
            # the worker may keep outputs past the call (sequence state): one device copy.
            self._torch.compiler.cudagraph_mark_step_begin()
            result = self._fn(*args)
            result = [t.clone() for t in result] if isinstance(result, (list, tuple)) else result.clone()
        else:
            result = self._fn(*args)
        return tuple(result) if self._tuple and isinstance(result, list) else result


def sample_tensors(torch: Any, config: mc.ModelConfig, dtypes: dict[int, Any], device: Any,
                   size: int) -> dict[str, Any]:
    """One tensor per config input, its variable dimensions (batch, -1) of ``size`` (the
    batch at most max_batch_size): random floats in [0, 1), zeros otherwise (valid indices)."""
    generator = torch.Generator().manual_seed(size)
    batch = [min(size, config.max_batch_size)] if config.max_batch_size > 0 else []
    tensors = {}
    for t in config.input:
        dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
        shape = batch + [size if d < 0 else d for d in dims]
        dtype = dtypes[t.data_type]
        value = torch.rand(shape, generator=generator) if dtype.is_floating_point else torch.zeros(shape)
        tensors[t.name] = value.to(dtype=dtype, device=device)
    return tensors


def compile_module(
    torch: Any, module: Any, settings: CompileSettings, sample: Callable[[int], list[Any]],
    call: Callable[[Callable[..., Any], list[Any]], Any], cuda: bool,
) -> CompiledModel:
    """The TorchScript ``module`` compiled and warmed; raises ``CompileFailed``.

    ``sample(size)``: forward()'s arguments at that size; ``call(fn, args)``: runs
    ``fn(*args)`` under the modes every request runs under (dynamo guards on grad mode)."""
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError:
        raise CompileFailed(f"torch {torch.__version__} has no TorchScript converter "
                            f"(torch._export.converter)") from None
    with _LOCK:
        try:
            graph = TS2EPConverter(module, tuple(sample(TRACE_SIZE))).convert().module()
        except Exception as exc:
            raise CompileFailed(f"torch could not convert the TorchScript module for torch.compile: "
                                f"{reason(exc)}") from None
        try:
            # The graph's forward, not the module: the module's input-check hooks run
            # outside the compiled code, a few hundred microseconds a call.
            fn = torch.compile(graph.forward, backend=settings.backend, mode=settings.mode, dynamic=settings.dynamic,
                               fullgraph=settings.fullgraph, options=settings.options or None)
        except Exception as exc:
            raise CompileFailed(f"torch.compile refused the model: {reason(exc)}") from None
        return _warm(torch, module, fn, settings, sample, call, cuda)


def _warm(
    torch: Any, module: Any, fn: Callable[..., Any], settings: CompileSettings, sample: Callable[[int], list[Any]],
    call: Callable[[Callable[..., Any], list[Any]], Any], cuda: bool,
) -> CompiledModel:
    compiled: CompiledModel | None = None
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for size in WARM_SIZES[settings.dynamic]:
        args = sample(size)
        shapes = tuple(tuple(t.shape) for t in _tensors(args))
        if shapes in seen:  # the batch dimension stopped at max_batch_size
            continue
        seen.add(shapes)
        try:
            expected = call(module, args)
        except Exception as exc:  # the samples are only what the config says: the model may want others
            raise CompileFailed(f"the TorchScript module fails on sample inputs of shapes {list(shapes)}, "
                                f"so its compiled graph cannot be checked: {reason(exc)}") from None
        if compiled is None:
            compiled = CompiledModel(torch, fn, isinstance(expected, tuple), cuda and _cuda_graphs(torch, settings))
        try:
            got = call(compiled, args)
        except Exception as exc:
            raise CompileFailed(f"torch.compile ({settings.backend}) failed: {reason(exc)}") from None
        _check_same(torch, _values(got), _values(expected), shapes)
    assert compiled is not None
    return compiled


def _check_same(torch: Any, got: list[Any], expected: list[Any], shapes: tuple[tuple[int, ...], ...]) -> None:
    if len(got) != len(expected):
        raise CompileFailed(f"the compiled model returns {len(got)} values, the TorchScript module {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        # Loose enough for a compiler's reordered float arithmetic, not for a different answer.
        low = e.dtype in (torch.float16, torch.bfloat16)
        try:
            torch.testing.assert_close(g, e, rtol=1e-2 if low else 1e-3, atol=1e-3)
        except AssertionError as exc:
            raise CompileFailed(f"the compiled model's output {i} differs from the TorchScript module's on "
                                f"inputs of shapes {list(shapes)}: {reason(exc)}") from None


def _cuda_graphs(torch: Any, settings: CompileSettings) -> bool:
    if settings.backend != "inductor":
        return settings.backend == "cudagraphs"
    mode = torch._inductor.list_mode_options().get(settings.mode or "default", {})
    return bool(settings.options.get("triton.cudagraphs", mode.get("triton.cudagraphs", False)))


def _tensors(args: list[Any]) -> list[Any]:
    """The tensors of forward()'s arguments (a Dict[str, Tensor] argument's values)."""
    return [v for a in args for v in (a.values() if isinstance(a, dict) else [a])]


def _values(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def reason(exc: BaseException) -> str:
    """An exception's first paragraph, on one line: torch's compile errors go on for pages."""
    lines: list[str] = []
    for line in str(exc).strip().splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    name = type(exc).__name__
    text = text if text.startswith(name) or isinstance(exc, (CompileFailed, AssertionError)) else f"{name}: {text}"
    return text if len(text) <= 400 else text[:397] + "..."
