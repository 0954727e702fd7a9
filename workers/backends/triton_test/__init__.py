"""Triton's small C++ test backends, written again in Python and built in: ``identity``,
``repeat``, ``square``, ``sequence``, ``dyna_sequence``, ``iterative_sequence``, ``implicit_state``
(``conveyor.proto.triton_test_backends.NAMES``). Triton's QA suites serve their models with
these; a config names one with ``backend: "<name>"`` and needs no model file.

Each module follows its C++ backend's observable behaviour: the config checks in its words,
the ``parameters`` it reads, its outputs, errors, delays and response flags. All are request
backends (``workers/backends/base.py`` ``RequestBackend``)."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import unsupported
from conveyor.workers.backends.base import RequestBackend


def load_test_backend(backend: str, path: str, config: mc.ModelConfig, device: str,
                      instance_name: str) -> RequestBackend:
    """One instance of test backend ``backend``; its config checks fail the load (INVALID_ARG)."""
    if backend == "identity":
        from conveyor.workers.backends.triton_test.identity import IdentityBackend

        return IdentityBackend(path, config, instance_name)
    if backend == "repeat":
        from conveyor.workers.backends.triton_test.repeat import RepeatBackend

        return RepeatBackend(config, instance_name)
    if backend == "square":
        from conveyor.workers.backends.triton_test.square import SquareBackend

        return SquareBackend(config, instance_name)
    if backend == "sequence":
        from conveyor.workers.backends.triton_test.sequence import SequenceBackend

        return SequenceBackend(config, device)
    if backend == "dyna_sequence":
        from conveyor.workers.backends.triton_test.dyna_sequence import DynaSequenceBackend

        return DynaSequenceBackend(config, device)
    if backend == "iterative_sequence":
        from conveyor.workers.backends.triton_test.iterative_sequence import IterativeSequenceBackend

        return IterativeSequenceBackend(config, device)
    if backend == "implicit_state":
        from conveyor.workers.backends.triton_test.implicit_state import ImplicitStateBackend

        return ImplicitStateBackend(config)
    raise unsupported(f"backend '{backend}' is not supported by this worker")
