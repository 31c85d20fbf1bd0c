#!/usr/bin/env python3
"""The layering rules of docs/architecture.md, checked on the include lines of the tree.

1. No Qt header anywhere in engine/.
2. libtorch (ATen, c10, torch, caffe2) only in engine/gpu/ and engine/model/: not in the rest of
   the engine, the studio's widgets (ui/) or the programs (app/). bench/ and tests/ compare against
   libtorch on purpose and are not checked.
3. A header of engine/gpu/ or engine/model/ that code outside those two folders includes is
   torch-free, also through what it includes in turn.
4. The engine's folders include one way: each folder only from itself and the folders below it.
5. POSIX, Linux and Win32 headers only in engine/core/platform/ (docs/architecture.md,
   "Platforms"); tests (*_test.cpp) that fork or limit memory are exempt. The platform layer
   itself includes nothing of the engine but core/error.h and its own headers.

Prints every violation with file and line, and exits 1 when there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Folder -> the engine folders it may include (besides itself).
ARROWS = {
    "core": set(),
    "io": {"core"},
    "experts": {"core"},
    "gpu": {"core", "io"},
    "placement": {"core", "io"},
    "store": {"core"},
    "model": {"core", "io", "experts", "gpu", "placement"},
    "chat": {"core", "io"},
    "train": {"core", "io", "experts", "gpu", "placement", "model", "chat", "store"},
    "infer": {"core", "io", "experts", "gpu", "placement", "model", "chat"},
    "serve": {"core", "io", "experts", "gpu", "placement", "model", "chat", "infer"},
    "eval": {"core", "io"},
    "hub": {"core", "io"},
}
TORCH_FOLDERS = {"gpu", "model"}
TORCH_INCLUDE = re.compile(r'#\s*include\s*<(ATen|c10|torch|caffe2)/')
QT_INCLUDE = re.compile(r'#\s*include\s*<Q')
PROJECT_INCLUDE = re.compile(r'#\s*include\s*"((?:engine|ui|app)/[^"]+)"')
SOURCES = (".h", ".cpp", ".cu")
OS_INCLUDE = re.compile(
    r'#\s*include\s*<(unistd|fcntl|pwd|numa|windows|signal|csignal|malloc|sched|pthread|dlfcn|'
    r'io|shlobj|knownfolders|sys/[a-z_]+)(\.h)?>')
PLATFORM_DIR = "engine/core/platform/"
PLATFORM_MAY_INCLUDE = re.compile(r'^engine/core/(platform/[a-z_]+\.h|error\.h)$')


def sources(folder):
    return sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in SOURCES and p.is_file())


def engine_folder(path):
    parts = path.relative_to(ROOT).parts
    return parts[1] if len(parts) > 2 and parts[0] == "engine" else None


def includes(path):
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        yield number, line


def torch_closure(header, seen, memo):
    """The first libtorch include reached from `header` through project includes, or None."""
    if header in memo:
        return memo[header]
    if header in seen or not header.exists():
        return None
    seen.add(header)
    found = None
    for number, line in includes(header):
        if TORCH_INCLUDE.search(line):
            found = f"{header.relative_to(ROOT)}:{number}: {line.strip()}"
            break
        match = PROJECT_INCLUDE.search(line)
        if match:
            found = torch_closure(ROOT / match.group(1), seen, memo)
            if found:
                break
    memo[header] = found
    return found


def main():
    problems = []
    memo = {}
    for path in sources("engine") + sources("ui") + sources("app"):
        rel = path.relative_to(ROOT)
        folder = engine_folder(path)
        torch_allowed = folder in TORCH_FOLDERS
        in_platform = rel.as_posix().startswith(PLATFORM_DIR)
        os_allowed = in_platform or rel.name.endswith("_test.cpp")
        for number, line in includes(path):
            where = f"{rel}:{number}"
            if not os_allowed and OS_INCLUDE.search(line):
                problems.append(f"{where}: an OS header outside engine/core/platform: {line.strip()}")
            if folder and QT_INCLUDE.search(line):
                problems.append(f"{where}: Qt in the engine: {line.strip()}")
            if not torch_allowed and TORCH_INCLUDE.search(line):
                problems.append(f"{where}: libtorch outside engine/gpu and engine/model: {line.strip()}")
            match = PROJECT_INCLUDE.search(line)
            if not match:
                continue
            target = match.group(1)
            if in_platform and not PLATFORM_MAY_INCLUDE.match(target):
                problems.append(f"{where}: the platform layer includes {target} (only its own headers and core/error.h)")
            target_folder = target.split("/")[1] if target.startswith("engine/") else None
            if folder and target.startswith(("ui/", "app/")):
                problems.append(f"{where}: the engine includes {target} (app -> ui -> engine, never back)")
            if folder and target_folder and target_folder != folder and target_folder not in ARROWS.get(folder, set()):
                problems.append(f"{where}: engine/{folder} includes {target}, against the arrows")
            if not torch_allowed and target_folder in TORCH_FOLDERS:
                reached = torch_closure(ROOT / target, set(), memo)
                if reached:
                    problems.append(f"{where}: includes {target}, which reaches libtorch ({reached})")
    for problem in problems:
        print(problem)
    print(f"{len(problems)} layering problem(s)" if problems else "layering: clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
