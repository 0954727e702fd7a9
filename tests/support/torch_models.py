"""TorchScript models (``model.pt`` + ``config.pbtxt``) for the tests, made with
``torch.jit.script`` / ``torch.jit.trace``: imported only where torch is."""

from __future__ import annotations

import os

import torch

from conveyor.deploy.example_repo import write_model


class AddSub(torch.nn.Module):
    """Triton's classic 'simple' model, in TorchScript."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Scale(torch.nn.Module):
    """Arguments the config names directly (listed there in the other order)."""

    def forward(self, image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return image * factor


class Doubler(torch.nn.Module):
    """Batched: each row doubled, plus each row's sum (to tell rows apart)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.sum(dim=1, keepdim=True)


class Upper(torch.nn.Module):
    """Strings: a 1-D BYTES tensor is a List[str] in TorchScript."""

    def forward(self, words: list[str]) -> list[str]:
        return [w.upper() for w in words]


class Flags(torch.nn.Module):
    """A sequence model whose forward() takes the sequence batcher's control tensors after its input, as Triton's
    libtorch sequence models do (qa/common/gen_qa_dyna_sequence_models.py): INPUT + 100 * START + 10 * READY."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, ready: torch.Tensor) -> torch.Tensor:
        return x + 100 * start + 10 * ready


class Accumulate(torch.nn.Module):
    """An implicit state as Triton's libtorch sequence models keep one (qa/L0_request_cancellation's
    implicit_state_model): forward(INPUT__0, STATE_IN__1) returns (OUTPUT__0, STATE_OUT__1), the state an output
    that the config does not declare; each answer is the running sum."""

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + state
        return total, total


class DictSum(torch.nn.Module):
    """One Dict[str, Tensor] argument: inputs arrive under their config names."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["A"] + 10 * inputs["B"]


class Mlp(torch.nn.Module):
    """Weights and two results: what torch.compile is for (batched)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.hidden(x))
        return self.out(h), h.sum(dim=1, keepdim=True)


class DoubleUntil(torch.nn.Module):
    """A loop on a tensor's value: torch's TorchScript converter cannot take it, so it
    does not compile (``prim::Loop``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while bool(x.abs().sum() < 100):
            x = x * 2 + 1
        return x


def save(module: torch.jit.ScriptModule, repo: str, name: str, config: str) -> str:
    path = os.path.join(write_model(repo, name, config), "1", "model.pt")
    module.save(path)
    return path


ADD_SUB_CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
{extra}
"""

SCALE_CONFIG = """name: "torch_named"
backend: "pytorch"
max_batch_size: 0
input [
  { name: "factor" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "image" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

DOUBLER_CONFIG = """name: "torch_batched"
platform: "pytorch_libtorch"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""

UPPER_CONFIG = """name: "torch_strings"
backend: "pytorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""

MLP_CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 5000 }}
{extra}
"""

LOOP_CONFIG = """name: "{name}"
backend: "pytorch"
max_batch_size: 0
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""


def compile_parameters(when: str = "true", backend: str = "aot_eager", **more: str) -> str:
    """A config's ``parameters`` asking for torch.compile (``more``: conveyor.torch_compile_<key>)."""
    pairs = {"conveyor.torch_compile": when, "conveyor.torch_compile_backend": backend,
             **{f"conveyor.torch_compile_{k}": v for k, v in more.items()}}
    return "parameters [" + ", ".join(f'{{ key: "{k}" value {{ string_value: "{v}" }} }}'
                                       for k, v in pairs.items()) + "]"


FLAGS_CONFIG = """name: "torch_sequence_flags"
platform: "pytorch_libtorch"
max_batch_size: 2
input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY__2" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

STATE_CONFIG = """name: "torch_sequence_state"
platform: "pytorch_libtorch"
max_batch_size: 2
input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "STATE_IN__1" output_name: "STATE_OUT__1" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

NO_INPUTS_CONFIG = """name: "torch_no_inputs"
platform: "pytorch_libtorch"
max_batch_size: 0
"""


def add_sub(repo: str, name: str = "torch_add_sub", extra: str = "") -> str:
    return save(torch.jit.script(AddSub()), repo, name, ADD_SUB_CONFIG.format(name=name, extra=extra))


def build(repo: str) -> None:
    add_sub(repo)
    save(torch.jit.script(Scale()), repo, "torch_named", SCALE_CONFIG)
    # Traced, not scripted: both kinds of TorchScript file load the same way.
    save(torch.jit.trace(Doubler(), torch.ones(2, 4)), repo, "torch_batched", DOUBLER_CONFIG)
    save(torch.jit.script(Upper()), repo, "torch_strings", UPPER_CONFIG)
    save(torch.jit.script(AddSub()), repo, "torch_no_inputs", NO_INPUTS_CONFIG)
    save(torch.jit.script(Flags()), repo, "torch_sequence_flags", FLAGS_CONFIG)
    save(torch.jit.script(Accumulate()), repo, "torch_sequence_state", STATE_CONFIG)


def build_compiled(repo: str) -> None:
    """Models asking for torch.compile: one that compiles, one that cannot (served
    uncompiled with ``auto``, refused with ``true``), one with a backend torch lacks."""
    save(torch.jit.script(Mlp()), repo, "torch_compiled", MLP_CONFIG.format(
        name="torch_compiled", extra=compile_parameters()))
    loop = torch.jit.script(DoubleUntil())
    for name, when in (("torch_compile_auto", "auto"), ("torch_compile_strict", "true")):
        save(loop, repo, name, LOOP_CONFIG.format(name=name, extra=compile_parameters(when)))
    save(loop, repo, "torch_compile_bad_backend", LOOP_CONFIG.format(
        name="torch_compile_bad_backend", extra=compile_parameters(backend="no_such_backend")))


PT2_CONFIG = """name: "{name}"
platform: "torch_aoti"
max_batch_size: {max_batch}
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {out0} ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ {out1} ] }}
]
{extra}
"""


def export_pt2(module: torch.nn.Module, path: str, max_batch: int, quick: bool = True, width: int = 4) -> str:
    """``module`` (taking one ``[batch, width]`` tensor ``x``) exported with a batch dimension of 1..max_batch
    and compiled by AOTInductor into the package ``path``, as docs/BACKENDS.md shows. ``quick``: the C++
    built without optimisation (a test's package: it compiles in about half the time)."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    options = {"aot_inductor.compile_wrapper_opt_level": "O0"} if quick else {}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Without it export and AOTInductor specialise sizes 0 and 1, and the package refuses a batch of one.
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        program = torch.export.export(module.eval(), (torch.randn(2, width),), dynamic_shapes={"x": {0: batch}})
        return str(torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=options))


def export_pt2_state(path: str, max_batch: int) -> str:
    """``Accumulate`` (``forward(x, state)``, two ``[batch, 1]`` INT32 tensors) as a package, as
    ``export_pt2`` makes one: a sequence model whose implicit state is an argument and a returned value."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    example = (torch.ones(2, 1, dtype=torch.int32), torch.ones(2, 1, dtype=torch.int32))
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        program = torch.export.export(Accumulate().eval(), example, dynamic_shapes={"x": {0: batch},
                                                                                     "state": {0: batch}})
        return str(torch._inductor.aoti_compile_and_package(
            program, package_path=path, inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"}))


# STATE_CONFIG's model as a PyTorch 2 package.
PT2_STATE_CONFIG = STATE_CONFIG.replace("torch_sequence_state", "pt2_sequence_state").replace(
    'platform: "pytorch_libtorch"', 'platform: "torch_aoti"')
