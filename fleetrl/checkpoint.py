"""Checkpoints: the aggregator's whole state at one version, one file per version.

A checkpoint is a torch-saved dict (see AggregatorCore.state()):
    version: int, spec: ModelSpec JSON, weights: {group: flat float32 ndarray},
    optim: {group: Adam state_dict}, norm_totals: ndarray
Files are written to a temporary name and renamed, so a crash never leaves a torn file.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import torch

_NAME = re.compile(r"^ckpt_(\d{10})\.pt$")


def checkpoint_path(directory: str | os.PathLike, version: int) -> pathlib.Path:
    return pathlib.Path(directory) / f"ckpt_{version:010d}.pt"


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any], keep: int) -> pathlib.Path:
    """Atomically write `state` as the checkpoint of its version; keep only the newest `keep`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, int(state["version"]))
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: str | os.PathLike) -> list[pathlib.Path]:
    """Checkpoint files in version order, oldest first."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def latest_checkpoint(directory: str | os.PathLike) -> pathlib.Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint file; a directory means its newest checkpoint."""
    path = pathlib.Path(path)
    if path.is_dir():
        newest = latest_checkpoint(path)
        if newest is None:
            raise FileNotFoundError(f"no checkpoint (ckpt_<version>.pt) in {path}")
        path = newest
    # weights_only=False: the file holds numpy arrays and optimizer state we wrote ourselves.
    return torch.load(path, map_location="cpu", weights_only=False)
