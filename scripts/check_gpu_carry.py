#!/usr/bin/env python3
"""Checks that the GPU check's carried packages cover what CMake looks for.

    python3 scripts/check_gpu_carry.py [ROOT]

The GPU box has no package manager: every library the build finds must be
either carried (a Debian package in scripts/fetch_gpu_check_deps.sh's
`packages` list) or something the box is known to have (the CUDA toolkit,
Python, PyTorch's NVIDIA wheels), or not be needed by the box's build
(-DTPSP_MPI=OFF, oneDNN optional). Every find_package / find_library /
find_path / find_program of the CMake files must appear in SOURCES below,
and every carried package named there must be in the fetch list. Exits 1
with one line per gap: a new dependency cannot be added without deciding
how the GPU box gets it.
"""
import pathlib
import re
import sys

CARRIED = "carried"
ON_THE_BOX = "on the box"
NOT_NEEDED = "not needed on the box"
# what CMake looks for → how the GPU box gets it (a Debian package, or why none is needed)
SOURCES = {
    "OpenMP": (ON_THE_BOX, "the host compiler's libgomp"),
    "yaml-cpp": (CARRIED, "libyaml-cpp-dev"),
    "MPI": (NOT_NEEDED, "gpu_check.sh builds with -DTPSP_MPI=OFF"),
    "nlohmann_json": (CARRIED, "nlohmann-json3-dev"),
    "CLI11": (CARRIED, "libcli11-dev"),
    "PCRE2_INCLUDE": (CARRIED, "libpcre2-dev"),
    "PCRE2_LIBRARY": (CARRIED, "libpcre2-dev"),
    "OPENBLAS_LIBRARY": (CARRIED, "libopenblas-openmp-dev"),
    "OPENBLAS_INCLUDE": (CARRIED, "libopenblas-openmp-dev"),
    "dnnl": (NOT_NEEDED, "optional (QUIET): without it the linears run on OpenBLAS"),
    "CUDAToolkit": (ON_THE_BOX, "nvcc 13 and its toolkit"),
    "NCCL_INCLUDE": (ON_THE_BOX, "the toolkit's, else PyTorch's nvidia-nccl wheel"),
    "NCCL_LIBRARY": (ON_THE_BOX, "the toolkit's, else PyTorch's nvidia-nccl wheel"),
    "CUDNN_INCLUDE": (ON_THE_BOX, "the toolkit's, else PyTorch's nvidia-cudnn wheel"),
    "CUDNN_LIBRARY": (ON_THE_BOX, "the toolkit's, else PyTorch's nvidia-cudnn wheel"),
    "GTest": (CARRIED, "libgtest-dev"),
    "Python3": (ON_THE_BOX, "Python 3.12"),
    "MPIRUN": (NOT_NEEDED, "looked for only with TPSP_MPI"),
}
FIND = re.compile(r"\bfind_(package|library|path|program)\(\s*([A-Za-z0-9_.+-]+)")


def carried_packages(root):
    text = (root / "scripts/fetch_gpu_check_deps.sh").read_text()
    match = re.search(r"^packages=\(([^)]*)\)", text, re.M)
    if not match:
        sys.exit("check_gpu_carry: no packages=(...) list in scripts/fetch_gpu_check_deps.sh")
    return set(match.group(1).split())


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    carried = carried_packages(root)
    problems = []
    found = set()
    for cmake in sorted(root.glob("CMakeLists.txt")) + sorted(root.glob("*/CMakeLists.txt")):
        for kind, name in FIND.findall(cmake.read_text()):
            found.add(name)
            if name not in SOURCES:
                problems.append(f"{cmake.relative_to(root)}: find_{kind}({name}): the GPU box's source of it is "
                                "not stated (scripts/check_gpu_carry.py SOURCES)")
    for name, (how, what) in sorted(SOURCES.items()):
        if name not in found:
            problems.append(f"SOURCES names {name}, which no CMakeLists.txt looks for")
        elif how == CARRIED and what not in carried:
            problems.append(f"{name} needs the Debian package {what}, which scripts/fetch_gpu_check_deps.sh "
                            "does not carry")
    for problem in problems:
        print("check_gpu_carry:", problem)
    if not problems:
        print(f"check_gpu_carry: {len(found)} dependencies, each carried or on the box "
              f"({len(carried)} packages carried)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
