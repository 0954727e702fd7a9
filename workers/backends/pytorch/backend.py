"""TorchScript models (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``,
``<version>/model.pt``) on torch: on the CPU, or on ``cuda:N`` for KIND_GPU instances.

Inputs become tensors without a copy: ``torch.from_numpy`` over the shared-memory
views, DLPack over a client's CUDA arrays. A GPU instance hands its outputs back
as cupy arrays over the same device memory (DLPack), so the worker copies them
device-to-device into a client's CUDA region, or once to the host otherwise.
Config names map onto ``forward``'s arguments and returned tuple by Triton's
rules (``naming``); ``List[str]`` arguments and results carry 1-D BYTES tensors.
With ``conveyor.torch_compile`` the module is compiled at load (``torch_compile``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, invalid_arg, unavailable
from conveyor.proto.repository_files import check_regular, unreadable
from conveyor.workers.backends.pytorch.compile import CompileFailed, compile_module, sample_tensors
from conveyor.workers.backends.pytorch.compile_settings import SWITCH, CompileSettings
from conveyor.workers.backends.pytorch.naming import input_positions, output_positions
from conveyor.workers.backends.pytorch.settings import TorchSettings
from conveyor.workers.backends.pytorch.sharing import SHARED
from conveyor.workers.client_regions import is_device_array

try:
    import torch
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("PyTorch is not installed in the worker's environment (pip install 'conveyor[torch]')") from None

log = logging.getLogger(__name__)

# Triton's config types that TorchScript tensors can hold (TYPE_STRING is a List[str] instead).
TORCH_DTYPES: dict[int, Any] = {
    mc.TYPE_BOOL: torch.bool, mc.TYPE_UINT8: torch.uint8, mc.TYPE_INT8: torch.int8, mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32, mc.TYPE_INT64: torch.int64, mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32, mc.TYPE_FP64: torch.float64, mc.TYPE_BF16: torch.bfloat16,
}


def check_config(config: mc.ModelConfig) -> None:
    """What Triton's PyTorch backend refuses at load: no outputs (it cannot complete a
    config from a TorchScript file; too few inputs are forward()'s to count), a type torch
    has no tensor of, or a string tensor of more than one dimension (strings travel as
    ``List[str]``)."""
    if not config.output:
        raise unavailable("model configuration must contain at least one output, none were specified")
    batched = config.max_batch_size > 0
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            if t.data_type == mc.TYPE_STRING:
                dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
                if len(dims) + batched > 1:
                    raise unavailable(f"{kind} '{t.name}': TorchScript takes strings as a 1-dimensional "
                                      f"List[str] only, and its shape has {len(dims) + batched} dimensions")
            elif t.data_type not in TORCH_DTYPES:
                raise unavailable(f"unsupported datatype {mc.DataType.Name(t.data_type)} for {kind} '{t.name}' "
                                  f"(TorchScript has no such tensor type)")


def sequence_inputs(config: mc.ModelConfig) -> dict[str, int]:
    """The tensors a sequence batcher adds to each request, which forward() takes as inputs too (as Triton's
    backend counts them): its control inputs (a flag's type is the int/fp32/bool of its values; only CORRID's is
    declared, and only a STRING one matters here) and its implicit states. Name: config type."""
    if not config.HasField("sequence_batching"):
        return {}
    sb = config.sequence_batching
    extra: dict[str, int] = {ci.name: ci.control[0].data_type if ci.control else mc.TYPE_INVALID
                             for ci in sb.control_input}
    extra.update({s.input_name: s.data_type for s in sb.state})
    return extra


def forward_arguments(module: Any) -> list[tuple[str, str]]:
    """``forward``'s arguments as (name, type kind), without ``self``."""
    args = [(a.name, a.type.kind()) for a in module.forward.schema.arguments]
    return args[1:] if args and args[0][1] == "ClassType" else args


def torch_device(device: str) -> Any:
    """The torch device of an instance's ``device`` (``cpu`` or ``cuda:N``); UNAVAILABLE for a GPU torch cannot see."""
    found = torch.device(device if device.startswith("cuda") else "cpu")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise unavailable(f"the config asks for a GPU instance ({device}) but torch {torch.__version__} "
                          f"sees no CUDA device (a CPU build, or no GPU)")
    return found


class TorchScriptBackend:
    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        check_config(config)
        self.device = torch_device(device)
        self.accepts_device_arrays = self.device.type == "cuda"
        self.settings = TorchSettings.from_config(config)
        self.compile_settings = CompileSettings.from_config(config)
        if self.compile_settings.enabled:  # importing dynamo takes a while: only for a model that compiles
            self.compile_settings.check(torch._dynamo.list_backends(exclude_tags=()),
                                        torch._inductor.list_mode_options())
        self.settings.apply_threads(torch)
        self._shared = SHARED.key(path, str(self.device)) if self.settings.weight_sharing else None
        self.module = (self._load(path) if self._shared is None
                       else SHARED.acquire(self._shared, lambda: self._load(path)))
        # What each call runs: the TorchScript module, or the graph compiled from it.
        self.run: Callable[..., Any] = self.module
        self.compiled = False
        try:
            self._bind(path, config)
            if self.compile_settings.enabled:
                self._compile(config)
        except BaseException:
            self.close()  # a shared module has one user less
            raise

    def _bind(self, path: str, config: mc.ModelConfig) -> None:
        """Map the config's tensors onto forward()'s arguments and results."""
        try:
            arguments = forward_arguments(self.module)
        except Exception as exc:
            raise unavailable(f"torch could not load TorchScript model '{path}': {exc}") from None
        extra = sequence_inputs(config)
        names = [i.name for i in config.input] + list(extra)
        # A single Dict[str, Tensor] argument takes every input by its config name.
        self.dict_input = len(arguments) == 1 and arguments[0][1] == "DictType"
        if not self.dict_input:
            odd = [f"{n}: {k}" for n, k in arguments if k not in ("TensorType", "ListType")]
            if odd:
                raise unavailable(f"forward() takes {', '.join(odd)}; only Tensor and List[str] arguments, "
                                  f"or one Dict[str, Tensor], are supported")
            if len(arguments) != len(names):  # Triton's libtorch backend's words
                raise unavailable(f"unable to load model '{config.name}', configuration expects {len(names)} "
                                  f"inputs, model provides {len(arguments)}")
        self.positions = input_positions(names, [n for n, _ in arguments])
        if not self.dict_input and sorted(self.positions.values()) != list(range(len(names))):
            raise unavailable(f"input names {names} do not map one to one onto forward()'s "
                              f"{len(arguments)} arguments")
        # The implicit states' outputs are returned values too, numbered as the config's outputs are (Triton's
        # backend maps both), after them; a state output that is also a declared output is one value.
        self.output_types = {o.name: o.data_type for o in config.output}
        for state in config.sequence_batching.state:
            self.output_types.setdefault(state.output_name, state.data_type)
        self.output_positions = output_positions(list(self.output_types))
        self.input_types = {**extra, **{i.name: i.data_type for i in config.input}}

    def _load(self, path: str) -> Any:
        try:  # torch opens it by name again: a name swapped after this check is not seen
            check_regular(path)
        except OSError as exc:  # a FIFO would hold the instance's thread for ever (proto/repository_files.py)
            raise unavailable(unreadable(path, exc)) from None
        try:
            return torch.jit.load(path, map_location=self.device)
        except Exception as exc:
            raise unavailable(f"torch could not load TorchScript model '{path}': {exc}") from None

    def _compile(self, config: mc.ModelConfig) -> None:
        s = self.compile_settings
        try:
            strings = [t.name for t in config.input if t.data_type == mc.TYPE_STRING] + \
                [t.name for t in config.output if t.data_type == mc.TYPE_STRING]
            if strings:
                raise CompileFailed(f"torch.compile takes tensors only, and '{strings[0]}' is TYPE_STRING "
                                    f"(a List[str] in TorchScript)")
            self.run = compile_module(
                torch, self.module, s,
                lambda size: self._arguments(sample_tensors(torch, config, TORCH_DTYPES, self.device, size)),
                self._call, self.device.type == "cuda")
            self.compiled = True
        except CompileFailed as exc:
            if s.when == "on":
                raise unavailable(f"{exc} ('{SWITCH}' is true; 'auto' would serve the model uncompiled)") from None
            log.warning("serving the TorchScript model uncompiled ('%s' is auto): %s", SWITCH, exc)

    def _arguments(self, tensors: dict[str, Any]) -> list[Any]:
        """forward()'s arguments from tensors by config name."""
        if self.dict_input:
            return [tensors]
        args: list[Any] = [None] * len(self.positions)
        for name, value in tensors.items():
            args[self.positions[name]] = value
        return args

    def _call(self, run: Callable[..., Any], args: list[Any]) -> Any:
        s = self.settings
        s.set_for_call(torch)
        # no_grad always, inference_mode unless the config turns it off: as Triton's backend.
        with torch.jit.optimized_execution(s.optimized_execution), torch.no_grad(), \
                torch.inference_mode(s.inference_mode):
            return run(*args)

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        args = self._arguments({name: self._to_torch(name, arr) for name, arr in inputs.items()})
        try:
            result = self._call(self.run, args)
        except Exception as exc:
            raise internal(f"PyTorch execute failure: {exc}") from None
        values = _returned_values(result)
        out = {}
        for name in outputs:
            index = self.output_positions.get(name, -1)
            if not 0 <= index < len(values):
                raise internal(f"output '{name}' is at position {index} but the model returned {len(values)} values")
            out[name] = self._from_torch(name, values[index])
        if self.settings.cache_cleaning and self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def _to_torch(self, name: str, arr: Any) -> Any:
        dtype = self.input_types.get(name)
        if dtype == mc.TYPE_STRING:
            return [_decode(name, b) for b in np.asarray(arr).reshape(-1)]
        if is_device_array(arr):
            t = torch.from_dlpack(arr)
        else:
            arr = np.asarray(arr)
            if not arr.flags.writeable:
                # A client segment mapped read-only: torch tensors are writable, so this is the one copy.
                arr = arr.copy()
            t = torch.from_numpy(arr)
        if dtype == mc.TYPE_BF16:  # travels as raw 2-byte words
            t = t.view(torch.bfloat16)
        return t.to(self.device)

    def _from_torch(self, name: str, value: Any) -> Any:
        expected = self.output_types.get(name)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            if expected != mc.TYPE_STRING:
                raise internal(f"output '{name}': the model returned List[str] but the config declares "
                               f"{mc.DataType.Name(expected or 0)}")
            return np.array([s.encode("utf-8") for s in value], dtype=np.object_)
        if not isinstance(value, torch.Tensor):
            raise internal(f"output '{name}': the model returned {type(value).__name__}, "
                           f"not a Tensor or List[str]")
        if expected is not None and TORCH_DTYPES.get(expected) != value.dtype:
            raise internal(f"configuration expects datatype {mc.DataType.Name(expected)} for output '{name}', "
                           f"model provides {value.dtype}")
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.view(torch.int16)  # numpy and the wire have no bfloat16: its raw 2-byte words
        arr = device_array(value) if value.device.type == "cuda" else value.numpy()
        return arr.view(np.uint16) if expected == mc.TYPE_BF16 else arr

    def close(self) -> None:
        self.run = self.module = _unloaded  # drops this instance's hold on the weights
        if self._shared is not None:
            SHARED.release(self._shared)
            self._shared = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _unloaded(*args: Any) -> Any:
    raise internal("the model instance was unloaded")


def device_array(value: Any) -> Any:
    """A cupy array over a CUDA tensor's memory (DLPack keeps the tensor alive); a host copy without cupy."""
    try:
        import cupy
    except ImportError:
        return value.cpu().numpy()
    return cupy.from_dlpack(value)


def _returned_values(result: Any) -> list[Any]:
    """forward()'s result as a list of outputs: a Tensor, a List[str], or a tuple of those."""
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, torch.Tensor) or (isinstance(result, list) and all(isinstance(s, str) for s in result)):
        return [result]
    raise internal(f"the model returned {type(result).__name__}: outputs must be a Tensor, a List[str] "
                   f"or a tuple of those")


def _decode(name: str, item: Any) -> str:
    try:
        return item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        raise invalid_arg(f"input '{name}': TorchScript strings must be UTF-8") from None
