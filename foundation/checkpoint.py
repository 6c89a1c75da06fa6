"""Checkpoints: the aggregator's whole state at one version, one file per version, durable.

    save_checkpoint(dir, core.state(), keep=3)      # write, fsync, rename, fsync the folder
    state = load_checkpoint(dir)                     # newest sound one; a corrupt newest is skipped

A file is a one-line header then a `torch.save` payload of tensors and plain values only:

    FLEETRL-CKPT 1 sha256=<hex of the payload> bytes=<payload length>\\n<payload>

so a torn or altered file is detected before it is read, and loading never unpickles code
(`torch.load(weights_only=True)`). The state (see AggregatorCore.state()):
    version: int, task: str, spec: ModelSpec JSON, weights: {group: float32 tensor},
    optim: {group: Adam state_dict}, norm_totals: float64 tensor, clean_shutdown: bool

`VersionLease` records the highest version the aggregator may publish before its next
checkpoint, so a restart after a crash never reuses a version number already broadcast.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import logging
import os
import pathlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from foundation.config import ConfigError
from foundation.errors import FleetrlError
from foundation.policy import ACTOR_GROUPS, ModelSpec

log = logging.getLogger("fleetrl.checkpoint")

_NAME = re.compile(r"^ckpt_(\d{10})\.pt$")
_MAGIC = b"FLEETRL-CKPT 1 "
_HEADER = re.compile(rb"^FLEETRL-CKPT 1 sha256=([0-9a-f]{64}) bytes=(\d+)$")
_tmp_ids = itertools.count()  # unique temporary names: two writers never share one


class CheckpointError(FleetrlError, ValueError):
    """A checkpoint cannot be used: a file torn, altered or not a fleetrl checkpoint, or one that
    holds no usable policy (weights missing, NaN or inf, a spec that does not fit); the message
    names the file and what is wrong."""


def checkpoint_path(directory: str | os.PathLike, version: int) -> pathlib.Path:
    return pathlib.Path(directory) / f"ckpt_{version:010d}.pt"


# torch loads only where a checkpoint is encoded or decoded: the roles that never touch one
# (samplers, the buffer) do not pay its ~200 MiB, which a sampler would also pin (mlockall).


def _to_tensors(value: Any) -> Any:
    """numpy arrays -> tensors, recursively: what weights_only loading accepts."""
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _to_tensors(v) for k, v in value.items()}
    return value


def _to_numpy(value: Any, depth: int = 0) -> Any:
    """The inverse for the top-level weights and norm totals (optimizer state stays torch)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict) and depth == 0:
        return {k: _to_numpy(v, 1) for k, v in value.items()}
    return value


def encode_checkpoint(state: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(_to_tensors(state), buffer)
    payload = buffer.getvalue()
    header = _MAGIC + f"sha256={hashlib.sha256(payload).hexdigest()} bytes={len(payload)}\n".encode()
    return header + payload


def decode_checkpoint(data: bytes, name: str = "checkpoint") -> dict[str, Any]:
    header, sep, payload = data.partition(b"\n")
    match = _HEADER.match(header)
    if not sep or match is None:
        raise CheckpointError(f"{name}: not a fleetrl checkpoint (bad header)")
    import torch

    digest, size = match.group(1).decode(), int(match.group(2))
    if len(payload) != size:
        raise CheckpointError(f"{name}: {len(payload)} payload bytes, header says {size} (torn write?)")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{name}: checksum mismatch (corrupt or altered)")
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: payload is not a state dict")
    state["weights"] = _to_numpy(state.get("weights", {}))
    if isinstance(state.get("norm_totals"), torch.Tensor):
        state["norm_totals"] = state["norm_totals"].numpy()
    return state


def _write_durably(path: pathlib.Path, data: bytes) -> None:
    """Write to a unique temporary file, fsync it, rename it into place, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{next(_tmp_ids)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut only once the folder is synced
    finally:
        os.close(folder)


_save_lock = threading.Lock()  # the periodic and the exit checkpoint never interleave


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any], keep: int) -> pathlib.Path:
    """Durably write `state` as the checkpoint of its version; keep only the newest `keep`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, int(state["version"]))
    data = encode_checkpoint(state)
    with _save_lock:
        _write_durably(path, data)
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


def resolve_checkpoint(path: str | os.PathLike) -> pathlib.Path:
    """A ckpt_<version>.pt file as given, or a folder's newest (CheckpointError naming the folder
    when it holds none)."""
    path = pathlib.Path(path)
    if not path.is_dir():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint (ckpt_<version>.pt) in this folder")
    return found


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint file; a directory means its newest sound checkpoint (a corrupt newer
    one is skipped with a warning). Raises CheckpointError or FileNotFoundError."""
    path = pathlib.Path(path)
    if not path.is_dir():
        return decode_checkpoint(path.read_bytes(), str(path))
    found = list_checkpoints(path)
    if not found:
        raise FileNotFoundError(f"no checkpoint (ckpt_<version>.pt) in {path}")
    for candidate in reversed(found):
        try:
            return decode_checkpoint(candidate.read_bytes(), str(candidate))
        except (CheckpointError, OSError, RuntimeError) as err:
            log.warning("skipping checkpoint %s: %s", candidate, err)
    raise CheckpointError(f"no sound checkpoint in {path}: all {len(found)} are corrupt (see warnings)")


class VersionLease:
    """The highest version the aggregator may publish, persisted before it is used.

        lease = VersionLease(run_dir / "version_lease", ahead=500)
        lease.ensure(version)        # before broadcasting `version`: extends (fsync) when needed
        resume_at = lease.restart_version(checkpoint_version)

    After a crash, the weights restored from the newest checkpoint get a version past every
    number that may have been broadcast, so no version number ever names two sets of weights.
    """

    def __init__(self, path: str | os.PathLike, ahead: int) -> None:
        if ahead < 1:
            raise ValueError(f"ahead ({ahead}) must be >= 1")
        self.path = pathlib.Path(path)
        self.ahead = ahead
        self.granted = self.read()

    def read(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def ensure(self, version: int) -> None:
        if version <= self.granted:
            return
        self.granted = version + self.ahead
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_durably(self.path, f"{self.granted}\n".encode())

    def restart_version(self, checkpoint_version: int, clean_shutdown: bool) -> int:
        """The version to resume at: the checkpoint's after a clean stop, else past the lease."""
        if clean_shutdown:
            return checkpoint_version
        return max(checkpoint_version, self.granted) + 1


# The policy in a checkpoint: what export (deploy_npu) and evaluation (sampler/evaluator.py) read.


@dataclass(frozen=True)
class PolicyCheckpoint:
    """The part of an aggregator checkpoint that a deployed policy needs (ACTOR_GROUPS)."""

    version: int
    spec: ModelSpec
    actor: np.ndarray  # flat float32 actor parameters
    obs_norm: np.ndarray  # flat float32 input mean ++ std
    source: str  # where it came from, for reports and error messages
    task: str | None = None  # task(s) the run trained on (checkpoints record it); None if unknown
    weights: str = "live"  # "live": the aggregator's newest actor; "swa": its weight average

    @property
    def task_names(self) -> list[str]:
        """The run's tasks, in order (several for a multi-task run; [] when not recorded)."""
        return [name for name in (self.task or "").split(",") if name]


CheckpointSource = str | os.PathLike | Mapping[str, Any] | PolicyCheckpoint


def _read_state(checkpoint: str | os.PathLike | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(checkpoint, Mapping):
        return checkpoint, "<in-memory checkpoint>"
    path = pathlib.Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist: pass a ckpt_<version>.pt file or the directory holding them"
        )
    try:
        state = load_checkpoint(path)
    except FileNotFoundError:
        raise  # an empty directory: load_checkpoint's message already names it
    except Exception as exc:  # torch.load raises pickle, zip and EOF errors alike on a bad file
        raise CheckpointError(
            f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}: {exc}); "
            "expected a file written by foundation.checkpoint.save_checkpoint"
        ) from exc
    if not isinstance(state, Mapping):
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, expected a dict")
    return state, str(path)


WEIGHT_CHOICES = ("best", "live", "swa", "swa_plain")


def load_policy_checkpoint(checkpoint: CheckpointSource, weights: str = "best") -> PolicyCheckpoint:
    """Read and validate a checkpoint (path, directory = newest in it, or AggregatorCore.state() dict).

    `weights`: "live" the newest actor; "swa" the weight average of a run with aggregator.swa
    on ("swa_plain": a layered run's plain average, for comparisons); "best" the average when
    the evaluator scored it above the live policy, else live.
    A PolicyCheckpoint is returned as it is, so callers can load once and pass it on.
    Raises FileNotFoundError for a missing path and CheckpointError for anything unusable.
    """
    if weights not in WEIGHT_CHOICES:
        raise ConfigError(f"weights {weights!r}: expected one of {WEIGHT_CHOICES}", field="weights")
    choice = weights
    if isinstance(checkpoint, PolicyCheckpoint):
        return checkpoint
    state, source = _read_state(checkpoint)
    missing = [k for k in ("version", "spec", "weights") if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {source} lacks {missing}: not an AggregatorCore.state() dict")
    groups = state["weights"]
    absent = [g for g in ACTOR_GROUPS if g not in groups]
    if absent:
        raise CheckpointError(f"checkpoint {source} has no weight group(s) {absent}; a policy needs {ACTOR_GROUPS}")
    try:
        spec = ModelSpec.from_json(state["spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {source}: unreadable model spec {state['spec']!r} ({exc})") from exc
    flats = {g: np.asarray(groups[g], np.float32) for g in ACTOR_GROUPS}
    chosen = _choose_weights(state, choice, source)
    if chosen != "live":
        flats["actor"] = np.asarray(state[chosen]["actor"], np.float32)
    for group, flat in flats.items():
        if not np.all(np.isfinite(flat)):
            raise CheckpointError(f"checkpoint {source}: weights[{group!r}] contain NaN or inf; the policy is unusable")
    task = state.get("task") or None
    return PolicyCheckpoint(int(state["version"]), spec, flats["actor"], flats["obs_norm"], source, task, chosen)


def _choose_weights(state: Mapping[str, Any], choice: str, source: str) -> str:
    if choice in ("swa", "swa_plain") and (state.get(choice) or {}).get("actor") is None:
        raise CheckpointError(f"checkpoint {source} holds no {choice} weight average (train with aggregator.swa on)")
    swa = state.get("swa") or {}
    has_average = swa.get("actor") is not None
    if choice != "best":
        return choice
    score, live = swa.get("score"), swa.get("live_score")
    better = has_average and score is not None and live is not None and score > live
    return "swa" if better else "live"
