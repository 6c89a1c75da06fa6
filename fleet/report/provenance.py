"""Which code a run ran: fleetrl's version, the git commit of its checkout, the libraries that
decide results.

    code = code_provenance()        # computed once per process, at its first call
    write_code_json(run_dir)        # <run_dir>/code.json at the start; summary.json's "code" too

A figure in summary.json is only worth its provenance: a run reads its code once, at its start,
so a launcher calls this before its roles start (a commit made in the checkout during a 45-minute
run does not rename the code that ran). "commit" is None outside a git checkout (an installed
wheel) or without git, and ends in "+dirty" when tracked files differ from the commit.
"""

from __future__ import annotations

import functools
import json
import pathlib
import platform
import subprocess
from importlib import metadata

import foundation

CHECKOUT = pathlib.Path(foundation.__file__).resolve().parent.parent  # the folder holding the top-level packages
LIBRARIES = (
    *("torch", "numpy", "mujoco", "gymnasium", "gymnasium-robotics", "metaworld"),  # what learns, what is simulated
    *("onnxruntime", "redis", "grpcio"),  # what exports, stores and carries
)
GIT_TIMEOUT_SEC = 5.0


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_SEC, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def _commit() -> str | None:
    if not (CHECKOUT / ".git").exists():  # a directory, or a file in a worktree
        return None
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip() + ("+dirty" if dirty and dirty.strip() else "")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def code_provenance() -> dict:
    return {
        "fleetrl": foundation.__version__,
        "commit": _commit(),
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in LIBRARIES},
    }


def write_code_json(run_dir: pathlib.Path) -> dict:
    code = code_provenance()
    (run_dir / "code.json").write_text(json.dumps(code, indent=2) + "\n")
    return code
