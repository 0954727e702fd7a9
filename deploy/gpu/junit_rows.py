"""Markdown table rows, one per test, from pytest's junit XML (for deploy/gpu/check.sh's report).

    python3 deploy/gpu/junit_rows.py JUNIT.xml >> ROWS.md
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def rows(path: str) -> list[str]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"pytest {case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
        status, detail = "PASS", f"{float(case.get('time', 0)):.1f} s"
        for child in case:
            if child.tag in ("failure", "error"):
                status, detail = "FAIL", (child.get("message") or child.tag)
            elif child.tag == "skipped" and status == "PASS":
                status, detail = "SKIP", (child.get("message") or "skipped")
        detail = " ".join(detail.split())[:300].replace("|", "\\|")
        out.append(f"| {name} | {status} | {detail} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows(sys.argv[1])))
