"""Build a folder in which ``conveyor.*`` and ``tests`` resolve as pyproject.toml maps them.

    python deploy/link_tree.py build/typecheck

setuptools alone knows the ``package-dir`` mapping of the top-level folders onto ``conveyor.*``;
mypy (``make typecheck``) and other static tools read this tree of links instead, made from that
mapping so that there is nothing to keep in step by hand.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def main(out: str) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    target = Path(out).resolve()
    (target / "conveyor").mkdir(parents=True, exist_ok=True)
    links = {f"conveyor/{name.removeprefix('conveyor.')}": folder for name, folder in mapping.items()}
    links["tests"] = "tests"
    for link, folder in links.items():
        path = target / link
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(os.path.relpath(ROOT / folder, path.parent))


if __name__ == "__main__":
    main(sys.argv[1])
