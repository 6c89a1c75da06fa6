"""The aggregator's persistence: restoring at start, and a thread that writes checkpoints.

state = restore(core, run_dir / "checkpoints", config)  # newest sound checkpoint, past the lease
writer = Checkpointer(run_dir, keep=3)
writer.submit(core.state())                       # returns at once; the newest state wins
writer.flush(); writer.close()
"""

from __future__ import annotations

import logging
import pathlib
import threading
from typing import Any

from aggregator.core import AggregatorCore
from foundation.checkpoint import CheckpointError, VersionLease, load_checkpoint, save_checkpoint
from foundation.config import AggregatorConfig

log = logging.getLogger("fleetrl.aggregator")


def restore(core: AggregatorCore, directory: pathlib.Path, config: AggregatorConfig) -> dict[str, Any] | None:
    """Load the newest sound checkpoint; after a crash, resume past every version that may
    have been broadcast (the lease), so no version number ever names two sets of weights.
    Returns the checkpoint's state (None when there is none) for the service's own records."""
    lease = VersionLease(directory.parent / "version_lease", ahead=config.checkpoint_every_versions)
    try:
        state = load_checkpoint(directory)
    except FileNotFoundError:
        if lease.granted > 0:
            # A crash before the first checkpoint: the versions the lease granted may have been
            # broadcast, so the initial weights come back under a number past them all.
            core.version = lease.restart_version(0, clean_shutdown=False)
            log.info(
                "no checkpoint (a crash before the first): the initial weights; resuming at version %d", core.version
            )
        return None
    except CheckpointError as err:
        raise CheckpointError(f"cannot resume from {directory}: {err}") from err
    core.load_state(state)
    core.version = lease.restart_version(core.version, bool(state.get("clean_shutdown", False)))
    log.info("restored checkpoint version %d; resuming at version %d", int(state["version"]), core.version)
    return state


class Checkpointer:
    """One background thread writes checkpoints; the newest queued state wins."""

    def __init__(self, run_dir: pathlib.Path | None, keep: int) -> None:
        self.directory = None if run_dir is None else run_dir / "checkpoints"
        self.keep = keep
        self._cond = threading.Condition()
        self._state: dict[str, Any] | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._thread.start()

    def submit(self, state: dict[str, Any]) -> None:
        with self._cond:
            self._state = state
            self._cond.notify_all()

    def flush(self, timeout: float = 60.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._state is None and not self._busy, timeout)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._state is not None or self._closed)
                if self._state is None:
                    return
                state, self._state, self._busy = self._state, None, True
            try:
                if self.directory is not None:
                    path = save_checkpoint(self.directory, state, keep=self.keep)
                    log.info("checkpoint version %d -> %s", state["version"], path)
            except OSError as err:  # a full disk must not kill training: the next one retries
                log.error("checkpoint version %d not written: %s", state["version"], err)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
