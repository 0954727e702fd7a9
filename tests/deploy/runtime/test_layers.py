"""The tree's layers, read from the imports: proto/ (what crosses the wire) imports only itself, deploy/runtime/
(what each process runs on) only proto/, and the actors (router/, workers/, ingress/, shm/) nothing else of
deploy/, which starts them."""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import ROOT

LEVEL = "unit"

RUNTIME = "deploy.runtime"
ALLOWED = {
    "proto": {"proto"},
    "deploy/runtime": {"proto", RUNTIME},
    "shm": {"proto", "shm"},
}
ACTORS = ("router", "workers", "ingress", "shm")


def conveyor_imports(folder: str) -> set[tuple[str, str]]:
    """(file, the conveyor.* package it imports) for every import in ``folder``."""
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "conveyor" and len(parts) > 1:
                    layer = RUNTIME if parts[1:3] == ["deploy", "runtime"] else parts[1]
                    found.add((str(path.relative_to(ROOT)), layer))
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_lower_layer_imports_only_below_it(folder: str) -> None:
    assert {(f, pkg) for f, pkg in conveyor_imports(folder) if pkg not in ALLOWED[folder]} == set()


@pytest.mark.parametrize("folder", ACTORS)
def test_actors_do_not_import_deploy(folder: str) -> None:
    assert {f for f, pkg in conveyor_imports(folder) if pkg == "deploy"} == set()
