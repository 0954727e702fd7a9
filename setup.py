"""Before setuptools reads pyproject.toml: build/src/conveyor/ made (or brought up to date) as links to the
top-level folders (deploy/link_tree.py), the src root pyproject's ``package-dir`` names.

setuptools' own scratch folder moves to build/setuptools: an sdist leaves that out, not all of build/, so it
carries build/src (as files) and no top-level folders, and there is nothing to link when a wheel is built from it."""

import runpy
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
LINK_TREE = ROOT / "deploy" / "link_tree.py"
if LINK_TREE.is_file():
    runpy.run_path(str(LINK_TREE))["make"](ROOT / "build" / "src", ROOT)
setup(options={"build": {"build_base": "build/setuptools"}})
