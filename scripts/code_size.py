"""The consolidation's yardsticks: product lines, long functions, repeated code.

    python3 scripts/code_size.py            # the three figures docs/architecture.md records
    python3 scripts/code_size.py --list     # and every function over 80 lines

Product is what ships: orchestrator/, strategies/, docker/, tui/ and
runner_plugins/ (tests, bench and scripts are not counted). Repeated code is
counted by the `duplicates` tool where it is installed (the development
machines have it), over the product folders copied side by side and over tests/.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("orchestrator", "strategies", "docker", "tui", "runner_plugins")
LONG = 80


def product_files() -> list[Path]:
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(files: list[Path], over: int = LONG) -> list[tuple[int, str]]:
    rows = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > over:
                    rows.append((length, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def duplicate_pairs(folder: Path) -> str:
    tool = shutil.which("duplicates")
    if tool is None:
        return "n/a (the duplicates tool is not on PATH)"
    out = subprocess.run(
        [tool, "--repo", str(folder), "--most", "200", "--seconds", "120"], capture_output=True, text=True
    ).stdout
    first = out.splitlines()[0] if out else ""
    match = re.match(r"(\d+) pairs? of places", first)
    return match.group(1) if match else first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list every function over 80 lines")
    args = parser.parse_args()
    files = product_files()
    lines = sum(len(p.read_bytes().splitlines()) for p in files)
    longs = long_functions(files)
    longest = long_functions(files, 0)[0]
    with tempfile.TemporaryDirectory() as tmp:
        # the product folders side by side, outside git, so pairs across folders count too
        for d in PRODUCT:
            shutil.copytree(ROOT / d, Path(tmp) / d, ignore=shutil.ignore_patterns("__pycache__"))
        product_pairs = duplicate_pairs(Path(tmp))
    print(f"product lines: {lines}")
    print(f"functions over {LONG} lines: {len(longs)} (the longest: {longest[0]} lines, {longest[1]})")
    print(f"duplicate pairs, product: {product_pairs}")
    print(f"duplicate pairs, tests: {duplicate_pairs(ROOT / 'tests')}")
    if args.list:
        for length, where in longs:
            print(f"  {length:4} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
