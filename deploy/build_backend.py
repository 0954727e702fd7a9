"""The build backend pyproject.toml names: setuptools', after ``build/src/conveyor/<folder>`` is made.

``conveyor.*`` is the top-level folders; setuptools builds from ``build/src`` (pyproject's ``package-dir``),
where ``deploy/link_tree.py`` links each of them. This backend makes those links before setuptools reads
anything, so a checkout needs no setup.py and no step of its own: ``pip install -e .`` or ``python -m build``.

setuptools' own scratch folder moves to ``build/setuptools``: an sdist leaves that folder out, not all of
``build/``, so it carries ``build/src`` as files and no top-level folders; built from an sdist, there is
nothing to link (pyproject's ``backend-path`` finds this module at ``build/src/conveyor/deploy`` there).
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from setuptools import build_meta, setup

SCRATCH = "build/setuptools"


class _Backend(build_meta._BuildMetaBackend):  # setuptools' own backend class, one step added
    def run_setup(self, setup_script: str = "setup.py") -> None:
        root = Path.cwd()  # a PEP 517 backend runs in the source tree
        link_tree = root / "deploy" / "link_tree.py"
        if link_tree.is_file():  # a checkout (an sdist has build/src already)
            runpy.run_path(str(link_tree))["make"](root / "build" / "src", root)
        setup(options={"build": {"build_base": SCRATCH}})


_BACKEND: Any = _Backend()
get_requires_for_build_wheel = _BACKEND.get_requires_for_build_wheel
get_requires_for_build_sdist = _BACKEND.get_requires_for_build_sdist
get_requires_for_build_editable = _BACKEND.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _BACKEND.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _BACKEND.prepare_metadata_for_build_editable
build_wheel = _BACKEND.build_wheel
build_sdist = _BACKEND.build_sdist
build_editable = _BACKEND.build_editable
