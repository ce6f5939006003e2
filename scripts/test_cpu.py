"""Sum a suite run's per-test CPU (`MINIFY_TEST_CPU=FILE make test`, tests/conftest.py) by module,
and list the costliest tests: where the suite's CPU goes, since it is CPU-bound on two cores. Each
pytest worker's line says how its share ended: its tests' CPU and when its last test ended, from
the run's first test (a worker that ends long before the others left a core idle at the end).

    .venv/bin/python scripts/test_cpu.py FILE [--top N]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        sums = by_module[row["test"].split("::", 1)[0]]
        sums[0] += row["own_s"] + row["children_s"]
        sums[1] += row["children_s"]
        sums[2] += row["wall_s"]
    total = sum(sums[0] for sums in by_module.values())
    print(f"{len(rows)} tests, {total:.0f} CPU-s ({sum(r['children_s'] for r in rows):.0f} in children)")
    print(f"{'CPU s':>8} {'children':>8} {'wall s':>8}  module")
    for module, (cpu, children, wall) in sorted(by_module.items(), key=lambda item: -item[1][0])[:args.top]:
        print(f"{cpu:8.1f} {children:8.1f} {wall:8.1f}  {module}")
    timed = [row for row in rows if "start" in row]  # older files have no worker or start
    if timed:
        first = min(row["start"] for row in timed)
        print(f"\n{'worker':>8} {'tests':>6} {'CPU s':>8} {'ends s':>8}")
        for worker in sorted({row["worker"] for row in timed}):
            own = [row for row in timed if row["worker"] == worker]
            ends = max(row["start"] + row["wall_s"] for row in own) - first
            cpu = sum(row["own_s"] + row["children_s"] for row in own)
            print(f"{worker or '-':>8} {len(own):6d} {cpu:8.1f} {ends:8.1f}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for row in sorted(rows, key=lambda row: -(row["own_s"] + row["children_s"]))[:args.top]:
        print(f"{row['own_s'] + row['children_s']:8.1f} {row['wall_s']:8.1f}  {row['test']}")


if __name__ == "__main__":
    main()
