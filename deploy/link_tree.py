"""The ``conveyor.*`` namespace as a folder of links to the top-level folders.

    python deploy/link_tree.py [DIR]     # DIR/conveyor/proto -> <checkout>/proto, ... (DIR: build/src)

Each top-level folder with an ``__init__.py`` is ``conveyor.<folder>``, except ``tests/`` (never installed):
nothing to list by hand. The build backend (``build_backend.py``) makes this tree in ``build/src``, the root
setuptools builds from (pyproject.toml: ``package-dir``), so an editable install is a plain ``.pth`` to that
folder, which mypy, pyright and import-graph tools read like any other path; a new module or subpackage shows
at once, being under a linked folder. Elsewhere, this script makes the same tree for a checkout that is not installed:
the GPU check (deploy/gpu/site.sh), or a checkout that shares another's environment: ``python
deploy/link_tree.py``, then ``PYTHONPATH=$PWD/build/src`` (mypy reads this checkout's build/src first anyway).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = {"tests"}


def folders(root: Path = ROOT) -> list[str]:
    """The top-level folders that are ``conveyor.<folder>``."""
    return sorted(p.parent.name for p in root.glob("*/__init__.py") if p.parent.name not in NOT_INSTALLED)


def make(target: Path, root: Path = ROOT) -> None:
    """Make (or bring up to date) ``target/conveyor/<folder>`` -> ``root/<folder>`` for each of :func:`folders`.

    Idempotent, and safe while another process imports through the tree: a link already right is left as it is,
    a wrong one is replaced in one rename, and one to a folder that is no longer a package is removed."""
    conveyor = Path(target).resolve() / "conveyor"
    conveyor.mkdir(parents=True, exist_ok=True)
    wanted = {name: os.path.relpath(root / name, conveyor) for name in folders(root)}
    for entry in conveyor.iterdir():
        if entry.is_symlink() and entry.name not in wanted:
            entry.unlink()
    for name, dest in wanted.items():
        link = conveyor / name
        if link.is_symlink() and os.readlink(link) == dest:
            continue
        tmp = conveyor / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(dest)
        os.replace(tmp, link)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "src")
