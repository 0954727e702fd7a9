"""PyTorch 2 packages (``platform: "torch_aoti"``, ``<version>/model.pt2``): a model exported with
``torch.export`` and compiled ahead of time by AOTInductor, loaded with ``aoti_load_package``.

A package holds compiled code for one device kind (and, on the CPU, one instruction set) and says
nothing of its tensors' names, so the config declares them and Triton's naming rules
(``naming``) give each one's position. The package's own checks of every input (dtype, each
dimension against its exported range) are switched on (``AOTI_RUNTIME_CHECK_INPUTS``): without them
a shape outside the exported range runs compiled code on memory it was not compiled for. A sequence
model's control inputs and implicit states are arguments and returned values as a TorchScript model's are
(``tensors``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, invalid_arg, unavailable
from conveyor.workers.backends.pytorch.naming import input_positions
from conveyor.workers.backends.pytorch.settings import TorchSettings
from conveyor.workers.backends.pytorch.tensors import TORCH_DTYPES, Tensors, check_file, check_one_to_one, torch_device

try:
    import torch
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("PyTorch is not installed in the worker's environment (pip install 'conveyor[torch]')") from None

log = logging.getLogger(__name__)

# Read once by each package's code, at its first call: set before any package runs. The checks cost a few
# comparisons per input; without them a batch outside the exported range is undefined behaviour.
os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"


# AOTInductor's names of the CPU features a package was compiled for (its AOTI_CPU_ISA metadata), as
# /proc/cpuinfo spells them: a package for features this CPU lacks would die of SIGILL on its first call.
_CPU_FEATURES = {"AVX2": "avx2", "AVX512": "avx512f", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
                 "AVX512_FP16": "avx512_fp16", "AMX_TILE": "amx_tile", "AMX_BF16": "amx_bf16"}

# "input_handles[2]: dim value is too large at 0, ...": the package's words for one input.
_INPUT_ERROR = re.compile(r"input_handles\[(\d+)\]: ([^\n]*)")


def check_config(config: mc.ModelConfig) -> None:
    if not config.input or not config.output:
        raise unavailable("a torch_aoti model's config must declare its inputs and outputs "
                          "(a .pt2 package does not record their names)")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            if t.data_type not in TORCH_DTYPES:
                raise unavailable(f"unsupported datatype {mc.DataType.Name(t.data_type)} for {kind} '{t.name}' "
                                  f"(an exported program takes and returns tensors only)")


def device_problem(metadata: dict[str, str], device: str, cpu_flags: set[str]) -> str:
    """Why a package compiled as ``metadata`` says cannot run on ``device`` here ("" if it can)."""
    compiled_for = metadata.get("AOTI_DEVICE_KEY", "")
    wanted = "cuda" if device.startswith("cuda") else "cpu"
    if compiled_for and compiled_for != wanted:
        kind = "KIND_GPU" if wanted == "cuda" else "KIND_CPU"
        return (f"the package was compiled for '{compiled_for}' and the instance is {kind} ({device}): "
                f"export and compile it for the instance's device")
    if wanted == "cpu":
        missing = [isa for isa in metadata.get("AOTI_CPU_ISA", "").split()
                   if isa in _CPU_FEATURES and _CPU_FEATURES[isa] not in cpu_flags]
        if missing:
            return (f"the package was compiled for CPU features this host lacks ({', '.join(missing)}): "
                    f"compile it on (or for) a CPU like this one")
    return ""


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def argument_count(call_spec: list[str]) -> int | None:
    """How many positional tensors the exported ``forward`` takes, from the package's input tree
    (``[version, {"type": "builtins.tuple", "children_spec": [args, kwargs]}]``); None if unreadable."""
    try:
        tree = json.loads(call_spec[0])[1]
        return len(tree["children_spec"][0]["children_spec"])
    except (ValueError, LookupError, TypeError):
        return None


class AotiBackend:
    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        check_config(config)
        self.device = torch_device(device)
        self.accepts_device_arrays = self.device.type == "cuda"
        self.settings = TorchSettings.from_config(config)
        self.settings.apply_threads(torch)
        check_file(path)
        try:
            index = self.device.index if self.device.index is not None else -1
            self.package = torch._inductor.aoti_load_package(path, device_index=index)
            metadata = dict(self.package.get_metadata())
            call_spec = list(self.package.loader.get_call_spec())
        except Exception as exc:
            raise unavailable(f"torch could not load the AOTInductor package '{path}': {_first_line(exc)}") from None
        problem = device_problem(metadata, str(self.device), cpu_flags())
        if problem:
            raise unavailable(f"'{path}': {problem}")
        self.tensors = Tensors(config, self.device)
        names = self.tensors.input_names
        takes = argument_count(call_spec)
        if takes is not None and takes != len(names):
            raise unavailable(f"the config declares {len(names)} inputs, the exported program takes {takes}")
        self.positions = input_positions(names, [])
        check_one_to_one(self.positions, names, f"the exported program's {len(names)} arguments")
        self.names_by_position = {p: n for n, p in self.positions.items()}

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        args: list[Any] = [None] * len(self.positions)
        for name, arr in inputs.items():
            args[self.positions[name]] = self.tensors.to_torch(name, arr)
        try:
            with torch.inference_mode():
                result = self.package(*args)
        except RuntimeError as exc:
            raise self._call_error(exc) from None
        return self.tensors.outputs(list(result) if isinstance(result, (tuple, list)) else [result], outputs)

    def _call_error(self, exc: RuntimeError) -> Exception:
        """An input the package's checks refused is the client's mistake (400), named by the config."""
        found = _INPUT_ERROR.search(str(exc))
        if found is not None:
            name = self.names_by_position.get(int(found.group(1)), f"#{found.group(1)}")
            return invalid_arg(f"input '{name}' is outside what the model was exported for: {found.group(2).strip()}")
        return internal(f"PyTorch execute failure: {_first_line(exc)}")

    def close(self) -> None:
        self.package = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
