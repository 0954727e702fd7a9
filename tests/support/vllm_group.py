"""The one process group that serves the tiny Llama to the vLLM tests that need a single engine of it
(tests/ingress/openai/test_openai_vllm_e2e.py over the OpenAI API, tests/workers/backends/vllm/
test_vllm_e2e.py over Triton's HTTP and gRPC paths), started once per test session: each vLLM engine
costs this 2-core host some 20-30 s to import and load, a group of them more. It serves the model on
every ingress with what both files need (``tests/conftest.py``'s ``vllm_group`` fixture):

- ``vllm_model``: guided decoding without free whitespace (xgrammar lets a JSON value pad with any
  whitespace, and the tiny model, random but for a few lines, pads forever), adapters loadable at run
  time, one more adapter found in the version's ``loras/`` folder, Triton's ``ENABLE_VLLM_HEALTH_CHECK``,
  a tool-call parser (``TOOL_CALL_PARSER``: a forced tool call needs one, as in vLLM);
- ``vllm_embed``: the same weights run by a pooling engine;
- explicit model control (``--load-model *``), so that an unhealthy model can unload.

``vllm_model`` reports the engine's ``vllm:`` metrics (``REPORT_CUSTOM_METRICS``), ``vllm_embed`` does not
(the backend's default). The group's log is in ``VllmGroup.log`` (tests read the backend's log lines).

A test that breaks the group for good (test_vllm_e2e.py's dead engine) says so with ``spend``: the next
test that asks gets a new group."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.deploy.ports import free_port
from tests.support import tiny_llama
from tests.support.group import Server, abandon, wait_ready
from tests.support.vllm_reference import EMBED_ENGINE, Reference, reference

MODEL = "vllm_model"
EMBED_MODEL = "vllm_embed"  # the same weights, run by a pooling engine
SEP = "_lora_"  # --lora-separator
FOLDER_ADAPTER = "gamma"  # in the version's loras/ folder: alpha's weights under another name
TOOL_PARSER = "llama3_json"  # the tiny model is a Llama
# Importing vLLM twice per engine (worker, engine core) and loading two engines, on a busy 2-core machine.
READY_TIMEOUT_S = 300.0


@dataclass
class VllmGroup:
    server: Server
    openai_port: int
    ref: Reference  # vLLM's own outputs (tests/support/vllm_reference.py)
    adapters: dict[str, Path]  # the tiny Llama's, by name
    log: Path  # the group's --log-file
    spent: bool = False  # a test broke it: the next one gets a new group


_live: VllmGroup | None = None
_started = 0


def group(tmp_path_factory: pytest.TempPathFactory) -> VllmGroup:
    """The session's group, started (again, if a test spent it) when first asked for."""
    global _live, _started
    if _live is not None and not _live.spent:
        return _live
    stop()
    _started += 1
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")  # the session's, as the other vLLM tests
    repo = tmp_path_factory.mktemp("vllm_group")
    model_dir = tiny_llama.write_repository(repo, tiny, MODEL, structured_outputs_config={
        "backend": "xgrammar", "disable_any_whitespace": True})
    with open(model_dir / "config.pbtxt", "a", encoding="utf-8") as f:
        f.write('parameters { key: "ALLOW_RUNTIME_LORA_UPDATING" value: { string_value: "true" } }\n')
        f.write('parameters { key: "ENABLE_VLLM_HEALTH_CHECK" value: { string_value: "true" } }\n')
        f.write(f'parameters {{ key: "TOOL_CALL_PARSER" value: {{ string_value: "{TOOL_PARSER}" }} }}\n')
        f.write('parameters { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }\n')
    (model_dir / "1" / "loras").mkdir()
    (model_dir / "1" / "loras" / FOLDER_ADAPTER).symlink_to(tiny.adapters["alpha"])  # found without a list
    tiny_llama.write_repository(repo, tiny, EMBED_MODEL, **EMBED_ENGINE)  # loads beside the generative one
    name = f"vg{os.getpid()}x{_started}"
    log = repo / "server.log"
    openai_port, http_port, grpc_port, metrics_port = (free_port() for _ in range(4))
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", str(repo), "--group", name,
        "--workers", "1", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port), "--openai-port", str(openai_port), "--http-address", "127.0.0.1",
        "--grpc-address", "127.0.0.1", "--openai-address", "127.0.0.1", "--lora-separator", SEP,
        "--arena-size", str(64 << 20), "--exit-timeout-secs", "20", "--drain-grace-secs", "0",
        "--model-control-mode", "explicit", "--load-model", "*", "--log-file", str(log),
    ])
    try:
        ref = reference(tiny)  # meanwhile the group loads its engines
        wait_ready(http_port, proc, (grpc_port, openai_port, metrics_port), timeout=READY_TIMEOUT_S)
    except BaseException:
        abandon(proc)
        raise
    _live = VllmGroup(Server(proc, name, http_port, grpc_port, metrics_port, str(repo)), openai_port, ref,
                      tiny.adapters, log)
    return _live


def spend(live: VllmGroup) -> None:
    live.spent = True


def stop() -> None:
    """Stop the group, if one runs: it exits cleanly and leaves no shared memory behind."""
    global _live
    live, _live = _live, None
    if live is None:
        return
    assert live.server.stop(60) == 0
    assert live.server.shm_segments() == [], "shared memory left behind after shutdown"
