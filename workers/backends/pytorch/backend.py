"""TorchScript models (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``,
``<version>/model.pt``) on torch: on the CPU, or on ``cuda:N`` for KIND_GPU instances.

Inputs and outputs travel as ``tensors`` says (no copy where one can be avoided).
Config names map onto ``forward``'s arguments and returned tuple by Triton's
rules (``naming``); ``List[str]`` arguments and results carry 1-D BYTES tensors.
With ``conveyor.torch_compile`` the module is compiled at load (``torch_compile``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable
from conveyor.workers.backends.pytorch.compile import CompileFailed, compile_module, sample_tensors
from conveyor.workers.backends.pytorch.compile_settings import SWITCH, CompileSettings
from conveyor.workers.backends.pytorch.naming import input_positions
from conveyor.workers.backends.pytorch.settings import TorchSettings
from conveyor.workers.backends.pytorch.sharing import SHARED
from conveyor.workers.backends.pytorch.tensors import TORCH_DTYPES, Tensors, check_file, check_one_to_one, torch_device

try:
    import torch
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("PyTorch is not installed in the worker's environment (pip install 'conveyor[torch]')") from None

log = logging.getLogger(__name__)


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


def forward_arguments(module: Any) -> list[tuple[str, str]]:
    """``forward``'s arguments as (name, type kind), without ``self``."""
    args = [(a.name, a.type.kind()) for a in module.forward.schema.arguments]
    return args[1:] if args and args[0][1] == "ClassType" else args


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
        self.tensors = Tensors(config, self.device)
        names = self.tensors.input_names
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
        if not self.dict_input:
            check_one_to_one(self.positions, names, f"forward()'s {len(arguments)} arguments")

    def _load(self, path: str) -> Any:
        check_file(path)
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
        args = self._arguments({name: self.tensors.to_torch(name, arr) for name, arr in inputs.items()})
        try:
            result = self._call(self.run, args)
        except Exception as exc:
            raise internal(f"PyTorch execute failure: {exc}") from None
        out = self.tensors.outputs(_returned_values(result), outputs)
        if self.settings.cache_cleaning and self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def close(self) -> None:
        self.run = self.module = _unloaded  # drops this instance's hold on the weights
        if self._shared is not None:
            SHARED.release(self._shared)
            self._shared = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _unloaded(*args: Any) -> Any:
    raise internal("the model instance was unloaded")


def _returned_values(result: Any) -> list[Any]:
    """forward()'s result as a list of outputs: a Tensor, a List[str], or a tuple of those."""
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, torch.Tensor) or (isinstance(result, list) and all(isinstance(s, str) for s in result)):
        return [result]
    raise internal(f"the model returned {type(result).__name__}: outputs must be a Tensor, a List[str] "
                   f"or a tuple of those")

