"""Each reason an actor exits for has a code of its own, declared in one table (proto/exit_codes.py): the
supervisor stops the group or restarts the actor by that code, so two reasons sharing one would do the wrong
thing for one of them (a worker whose vLLM engine died once stopped the group, as a refused start does)."""

from __future__ import annotations

import ast

from conveyor.proto import exit_codes
from tests.support.paths import ROOT

LEVEL = "unit"

FOLDERS = ("deploy", "router", "workers", "ingress", "shm", "proto")


def test_every_exit_code_is_a_different_number() -> None:
    codes = {name: value for name, value in vars(exit_codes).items() if name.endswith("_CODE")}
    assert len(codes) >= 6
    assert len(set(codes.values())) == len(codes), codes


def test_no_exit_code_is_declared_outside_the_table() -> None:
    elsewhere = []
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "proto" / "exit_codes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id.endswith("_CODE"):
                            elsewhere.append(f"{path.relative_to(ROOT)}: {target.id}")
    assert elsewhere == []
