#!/usr/bin/env python3
"""Checks that each room of the tree includes only what it may, and prints
which rooms include which (docs/design.md §5).

    python3 scripts/check_rooms.py [ROOT]

A room is a top-level folder (model/kernels/ counts as a room of its own).
Direct includes are checked against ALLOWED; the configuration headers are
also checked transitively: nothing they pull in may include MPI or a kernel
header. Exits 1 and names each offending include otherwise.
"""
import pathlib
import re
import sys

ROOMS = ["common", "parallel", "data", "model/kernels", "model", "train", "tests", "fuzz"]
ALLOWED = {
    "common": {"common"},
    "parallel": {"common", "parallel"},
    "data": {"common", "data"},
    "model/kernels": {"common", "model/kernels"},
    "model": {"common", "parallel", "model", "model/kernels"},
    "train": {"common", "parallel", "data", "model", "train"},
    "tests": set(ROOMS),
    "fuzz": set(ROOMS),
}
# Plain values that the config, the memory report and the checkpoint header
# share: whatever they include, transitively, must not bring in MPI or kernels.
PLAIN_HEADERS = ["common/errors.h", "model/gpt_config.h", "parallel/layout.h", "train/config.h"]
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def room_of(path):
    for room in ROOMS:  # model/kernels before model
        if path == room or path.startswith(room + "/"):
            return room
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    files = sorted(p for p in root.rglob("*") if p.suffix in {".h", ".cpp", ".cu"} and p.is_file()
                   and not any(part.startswith("build") or part == "single_process_mpi"
                               for part in p.relative_to(root).parts))
    includes = {}  # file -> (project includes, system includes)
    for f in files:
        rel = f.relative_to(root).as_posix()
        found = INCLUDE.findall(f.read_text(errors="replace"))
        includes[rel] = ([name for kind, name in found if kind == '"'], [name for kind, name in found if kind == "<"])

    problems, matrix = [], {}
    for rel, (project, _) in includes.items():
        room = room_of(rel)
        if room is None:
            continue
        for name in project:
            target = room_of(name)
            matrix.setdefault(room, set()).add(target)
            if target not in ALLOWED[room]:
                problems.append(f"{rel}: includes {name}: {room}/ may include only "
                                f"{', '.join(sorted(r + '/' for r in ALLOWED[room]))}")

    for header in PLAIN_HEADERS:
        seen, stack = set(), [header]
        while stack:
            current = stack.pop()
            if current in seen or current not in includes:
                continue
            seen.add(current)
            project, system = includes[current]
            if "mpi.h" in system or "mpi.h" in project:
                problems.append(f"{header}: pulls in MPI (through {current})")
            for name in project:
                if name.startswith("model/kernels/"):
                    problems.append(f"{header}: pulls in a kernel header ({name}, through {current})")
                stack.append(name)

    print("which rooms include which (project headers):")
    for room in ROOMS:
        if room in matrix:
            others = sorted(r for r in matrix[room] if r != room)
            print(f"  {room + '/':<15} -> {', '.join(r + '/' for r in others) or '(only itself)'}")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(problems)} include(s) break the rooms' rules" if problems else "every room includes only what it may")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
