"""``python -m conveyor.deploy.tritonserver``: the ``tritonserver`` command without its
console script (``deploy/cli.py``'s ``tritonserver_main``)."""

from __future__ import annotations

import sys

from conveyor.deploy.cli import tritonserver_main

if __name__ == "__main__":
    sys.exit(tritonserver_main())
