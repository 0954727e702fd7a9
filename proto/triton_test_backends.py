"""The names of Triton's small C++ test backends that Conveyor serves as built-ins
(``workers/backends/triton_test/``), so Triton's QA model repositories load unchanged.

Shared by the router (the repository scan accepts these names and asks no model file of them:
Triton loads them from ``<backend-directory>/<name>/libtriton_<name>.so``, and a QA version
directory is often empty) and the worker (which loads them)."""

from __future__ import annotations

NAMES = frozenset({
    "identity",  # identity_backend: OUTPUT<i> = INPUT<i>
    "repeat",  # repeat_backend: decoupled, one response per element of IN
    "square",  # square_backend: decoupled, IN[0] responses
    "sequence",  # server/src/test/sequence: an accumulator per sequence slot (START, READY)
    "dyna_sequence",  # server/src/test/dyna_sequence: an accumulator per sequence (START, END, READY, CORRID)
    "iterative_sequence",  # server/src/test/iterative_sequence: decoupled countdown, a response every 0.5 s
    "implicit_state",  # server/src/test/implicit_state: the backend API's implicit state, by TEST_CASE
})
