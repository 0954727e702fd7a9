"""Models of Triton's test backends (identity, repeat, square, sequence, dyna_sequence, implicit_state), as
Triton's QA writes them: a ``config.pbtxt`` and an empty version directory, no model file."""

from __future__ import annotations

import os

# Long enough that no test sequence idles out by accident on a slow machine.
LONG_IDLE_US = 60_000_000
# Long enough that a batch waits for its preferred size however slowly its requests arrive.
BATCH_WAIT_US = 30_000_000
IDENTITY_DELAY_MS = 300
SQUARE_INFER_NS = 50_000_000
SQUARE_OUTPUT_NS = 300_000_000

_CONTROL = 'control_input [ {{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }} ]'


def write(repo: str, name: str, config: str) -> None:
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(f'name: "{name}"\n{config}')


def identity(repo: str, name: str, data_type: str, max_batch_size: int, extra: str = "", dims: str = "[ -1 ]",
             optional: str = "") -> None:
    write(repo, name, f"""
backend: "identity"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {data_type} dims: {dims} {optional} }} ]
output [ {{ name: "OUTPUT0" data_type: {data_type} dims: {dims} }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{extra}
""")


def sequence_controls(*controls: tuple[str, str, str]) -> str:
    return "\n".join(_CONTROL.format(name=n, kind=k, values=v) for n, k, v in controls)


def build(repo: str) -> None:
    identity(repo, "identity_fp32", "TYPE_FP32", 8)
    identity(repo, "identity_bytes", "TYPE_STRING", 8)
    identity(repo, "identity_bf16", "TYPE_BF16", 8)
    identity(repo, "identity_nobatch_int8", "TYPE_INT8", 0)
    identity(repo, "identity_uint32", "TYPE_UINT32", 8,
             f"dynamic_batching {{ preferred_batch_size: [ 8 ] max_queue_delay_microseconds: {BATCH_WAIT_US} }}")
    identity(repo, "identity_delay", "TYPE_INT32", 8,
             f'parameters [ {{ key: "execute_delay_ms" value: {{ string_value: "{IDENTITY_DELAY_MS}" }} }} ]')
    write(repo, "identity_optional", """
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
""")
    # As the nop_tunnel_out models of Triton's QA ensembles: the model's [4] is the client's [2, 2].
    write(repo, "identity_reshape", """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]
instance_group [ { kind: KIND_CPU } ]
""")
    # Triton's identity refuses a config whose tensors do not follow its naming.
    write(repo, "identity_misnamed", """
backend: "identity"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""")
    for name, decoupled in (("repeat_int32", True), ("repeat_nondecoupled", False)):
        write(repo, name, f"""
backend: "repeat"
max_batch_size: 0
model_transaction_policy {{ decoupled: {decoupled} }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
        {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }},
        {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
""")
    write(repo, "square_int32", f"""
backend: "square"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
parameters [ {{ key: "CUSTOM_INFER_DELAY_NS" value: {{ string_value: "{SQUARE_INFER_NS}" }} }},
             {{ key: "CUSTOM_OUTPUT_DELAY_NS" value: {{ string_value: "{SQUARE_OUTPUT_NS}" }} }},
             {{ key: "CUSTOM_FAIL_COUNT" value: {{ string_value: "1" }} }},
             {{ key: "CUSTOM_EMPTY_COUNT" value: {{ string_value: "1" }} }} ]
""")
    int32_flags = "int32_false_true: [ 0, 1 ]"
    io = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
    write(repo, "sequence_int32", f"""
backend: "sequence"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  {sequence_controls(("START", "CONTROL_SEQUENCE_START", int32_flags),
                     ("READY", "CONTROL_SEQUENCE_READY", int32_flags))}
}}
{io}""")
    for name, corrid in (("dyna_sequence_int32", "TYPE_UINT64"), ("dyna_sequence_string", "TYPE_STRING")):
        write(repo, name, f"""
backend: "dyna_sequence"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 0 }}
  {sequence_controls(("START", "CONTROL_SEQUENCE_START", int32_flags),
                     ("END", "CONTROL_SEQUENCE_END", int32_flags),
                     ("READY", "CONTROL_SEQUENCE_READY", int32_flags),
                     ("CORRID", "CONTROL_SEQUENCE_CORRID", f"data_type: {corrid}"))}
}}
{io}""")
    # As L0_iterative_sequence: the model under the scheduler it needs, and under one that cannot reschedule.
    for name, scheduler in (("iterative_sequence", "iterative_sequence: true"),
                            ("iterative_direct", f"max_sequence_idle_microseconds: {LONG_IDLE_US} direct {{ }}")):
        write(repo, name, f"""
backend: "iterative_sequence"
max_batch_size: 1
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ {scheduler} }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
""")
    # As qa/L0_implicit_state's models: without a state, with one (zero initial state), and a growing one.
    fp32_flags = "fp32_false_true: [ 0, 1 ]"
    controls = sequence_controls(("START", "CONTROL_SEQUENCE_START", fp32_flags),
                                 ("READY", "CONTROL_SEQUENCE_READY", fp32_flags),
                                 ("END", "CONTROL_SEQUENCE_END", fp32_flags))
    states = {
        "implicit_no_state": "",
        "implicit_state_int32": 'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" '
                                'data_type: TYPE_INT32 dims: 1 '
                                'initial_state: { name: "zero" data_type: TYPE_INT32 dims: 1 zero_data: true } } ]',
        "implicit_growable": 'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT8 '
                             'dims: [ 1024, 1024 ] use_same_buffer_for_input_output: true '
                             'use_growable_memory: true } ]',
    }
    for name, state in states.items():
        state_output = ', { name: "OUTPUT_STATE" data_type: TYPE_INT8 dims: [ 1 ] }' if "growable" in name else ""
        write(repo, name, f"""
backend: "implicit_state"
max_batch_size: 0
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  {controls}
  {state}
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
        {{ name: "TEST_CASE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} {state_output} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
""")
