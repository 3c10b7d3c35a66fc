#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CI: checks what .ci/python.sh builds. Exit status 1 with one line per fault.

  check_dist.py sdist SDIST.tar.gz   the sdist holds every tracked file the wheel's build reads
                                      (git ls-files of CMakeLists.txt, cmake/, include/, runtime/,
                                      kernel_templates/, python/, pyproject.toml, LICENSE) and no build output
  check_dist.py wheel WHEEL.whl      a manylinux wheel: its tag is manylinux_2_N and auditwheel's
                                      (auditwheel show --json on PATH); the only library it needs from
                                      outside, besides the manylinux policy's, is libnccl.so.2; it holds
                                      LICENSE and the licence metadata; its libpooler.so is stripped of
                                      debug information, links neither libcuda nor libnvrtc (both opened
                                      at run time) and has no RPATH outside the wheel (readelf on PATH)
"""

import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What python/CMakeLists.txt and the project's CMakeLists.txt read when pooler is built as the wheel's subproject.
SDIST_SOURCES = ["CMakeLists.txt", "pyproject.toml", "LICENSE", "cmake", "include", "runtime", "kernel_templates",
                 "python"]
# libnccl.so.2 comes from torch's nvidia-nccl wheel (or the system): libpooler must bind to the NCCL that
# the engine's communicators come from, so the wheel never carries one (auditwheel repair --exclude).
EXTERNAL_ALLOWED = {"libnccl.so.2"}
# The driver and NVRTC are opened with dlopen at run time (runtime/jit/driver.cpp, nvrtc.cpp): libpooler
# never links them, and they come from the system (libcuda, with the driver) or the CUDA toolkit or torch's
# nvidia wheels (libnvrtc.so.13). None of these may be in the wheel.
DLOPENED = ("libcuda.so", "libnvrtc")
NOT_CARRIED = DLOPENED + ("libnccl",)
MANYLINUX = re.compile(r"^manylinux_2_([0-9]+)_x86_64$")


def fail(faults):
    for fault in faults:
        print(f"check_dist: {fault}", file=sys.stderr)
    sys.exit(1 if faults else 0)


def check_sdist(path):
    faults = []
    with tarfile.open(path) as archive:
        names = archive.getnames()
    top = f"{Path(path).name[:-len('.tar.gz')]}/"
    faults += [f"{path}: {name} is outside {top}" for name in names if not (name + "/").startswith(top)]
    held = {name[len(top):] for name in names if name.startswith(top)}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", *SDIST_SOURCES], check=True,
                             capture_output=True, text=True).stdout.split()
    if not tracked:
        faults.append(f"git ls-files in {ROOT} lists no sources")
    faults += [f"{path}: no {name} (the wheel's build reads it)" for name in tracked if name not in held]
    faults += [f"{path}: holds {name}, a build output" for name in held
               if re.search(r"(^|/)(build|dist)/|\.so(\.[0-9]+)*$|__pycache__", name)]
    print(f"check_dist: {path}: {len(held)} files, the {len(tracked)} tracked sources of the wheel's build among them")
    return faults


def readelf(arguments, path):
    return subprocess.run(["readelf", "--wide", *arguments, str(path)], check=True, capture_output=True,
                          text=True).stdout


def check_library(library, faults):
    sections = re.findall(r"\]\s+(\.\S+)", readelf(["--section-headers"], library))
    debug = [name for name in sections if name.startswith(".debug")]
    if debug:
        faults.append(f"libpooler.so is not stripped: sections {', '.join(debug)}")
    dynamic = readelf(["--dynamic"], library)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", dynamic)
    faults += [f"libpooler.so needs {name}, which it must open at run time" for name in needed
               if name.startswith(DLOPENED)]
    for paths in re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[([^]]*)\]", dynamic):
        faults += [f"libpooler.so has RPATH {entry!r}, outside the wheel" for entry in paths.split(":")
                   if not entry.startswith("$ORIGIN")]
    return needed


def check_wheel(path):
    faults = []
    tag = re.match(r"^[^-]+-[^-]+-[^-]+-[^-]+-(.+)\.whl$", Path(path).name)
    platform = tag.group(1) if tag else ""
    claimed = MANYLINUX.match(platform)
    if not claimed:
        faults.append(f"{path}: platform tag {platform!r} is not manylinux_2_N_x86_64")
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = next((name for name in names if name.endswith(".dist-info/WHEEL")), None)
        metadata = next((name for name in names if name.endswith(".dist-info/METADATA")), None)
        wheel_tags = re.findall(r"^Tag: \S+-\S+-(\S+)$", wheel.read(info).decode(), re.M) if info else []
        if wheel_tags != [platform]:
            faults.append(f"{path}: WHEEL says tags {wheel_tags}, the file name {platform}")
        if not metadata or "License: Apache-2.0" not in wheel.read(metadata).decode():
            faults.append(f"{path}: METADATA does not say License: Apache-2.0")
        for required in ("pooler/LICENSE", "pooler/libpooler.so", "pooler/_layout.py", "pooler/_build_info.py"):
            if required not in names:
                faults.append(f"{path}: no {required}")
        if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
            faults.append(f"{path}: no .dist-info/licenses/LICENSE")
        faults += [f"{path}: carries {name}, which must come from the system or torch" for name in names
                   if Path(name).name.startswith(NOT_CARRIED)]
        with tempfile.TemporaryDirectory() as folder:
            if "pooler/libpooler.so" in names:
                needed = check_library(wheel.extract("pooler/libpooler.so", folder), faults)
                print(f"check_dist: libpooler.so needs {', '.join(needed)}")
    shown = json.loads(subprocess.run(["auditwheel", "show", "--json", str(path)], check=True, capture_output=True,
                                      text=True).stdout)
    external = set(shown.get("external_libs", {}))
    if external - EXTERNAL_ALLOWED:
        faults.append(f"{path}: auditwheel finds external libraries {sorted(external - EXTERNAL_ALLOWED)} "
                      f"(only {sorted(EXTERNAL_ALLOWED)} may stay outside the wheel)")
    # auditwheel show does not know repair's --exclude (pypa/auditwheel#422): with libnccl.so.2 outside
    # the wheel its overall tag stays linux_x86_64; the symbols' tag is the one the wheel may claim.
    symbols = MANYLINUX.match(shown.get("sym_tag", ""))
    if not symbols:
        faults.append(f"{path}: auditwheel's symbol tag is {shown.get('sym_tag')!r}, not manylinux")
    elif claimed and int(claimed.group(1)) < int(symbols.group(1)):
        faults.append(f"{path}: claims {platform}, but its symbols need {shown['sym_tag']}")
    print(f"check_dist: {path}: tag {platform}, auditwheel's symbol tag {shown.get('sym_tag')}, "
          f"outside the wheel: {', '.join(sorted(external)) or 'nothing'}")
    return faults


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sdist", "wheel"):
        sys.exit(__doc__)
    fail(check_sdist(sys.argv[2]) if sys.argv[1] == "sdist" else check_wheel(sys.argv[2]))
