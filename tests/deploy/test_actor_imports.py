"""Each process of a group loads the packages its own job needs, not the other actors': every process
parses the same flags (deploy/settings.py), and a module the flags reached once brought falcon into the
router, the workers and the gRPC ingress, and the router's whole lifecycle (numpy, onnx) into the
supervisor and the workers. A group starts 7 Python processes on a 2-core host, so what each imports is
most of the time ``conveyor serve`` takes to be ready.

What a process imported is read from outside, in ``/proc/<pid>/maps``: each package here has an extension
module that it loads when imported."""

from __future__ import annotations

from tests.support.group import Server, roles

LEVEL = "e2e"

# A path inside the extension module each package loads on import.
MARKS = {"falcon": "/falcon/cyutil/", "numpy": "/numpy/_core/_multiarray_umath", "onnx": "/onnx/onnx_cpp2py_export"}


def _loaded(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        maps = f.read()
    return {name for name, mark in MARKS.items() if mark in maps}


def test_each_actor_loads_only_what_its_job_needs(server: Server) -> None:
    """The session's group (every kind of model in its repository)."""
    loaded = [(role, _loaded(pid)) for pid, role in [(server.proc.pid, "serve"), *roles(server).items()]]
    for role, packages in loaded:
        if role == "serve":
            assert packages == set(), loaded  # the supervisor only starts and watches processes
        elif role in ("router", "worker", "ingress-grpc"):
            assert "falcon" not in packages, loaded  # the HTTP ingress's framework
        if role == "worker":
            assert "onnx" not in packages, loaded  # ONNX Runtime reads the models, not onnx
    # The marks are right: the HTTP ingress serves with falcon, the router completes ONNX configs with onnx.
    assert ("ingress-http", {"falcon", "numpy"}) in loaded and any(r == "router" and "onnx" in p for r, p in loaded)
