"""One shape for every role process: what the fleet hands a role when it starts it.

    stop, security = stop_event(), Security.from_config(config.security)
    run_sampler(config, 3, SamplerEndpoints(buffer, aggregator), security, stop, Heartbeat(path))

Every role's entry point is a `Role`: sampler.worker.run_sampler, sampler.evaluator.run_evaluator,
learner.worker.run_learner, aggregator.service.run_aggregator and buffer.service.run_ingest_service.
fleet/cli/main.py starts each of them through that one call.

- config: the validated RunConfig (derived values resolved once, at launch)
- identity: the process's index within its role (sampler 3, learner 0; 0 for a lone service)
- endpoints: the role's own frozen dataclass: the addresses it needs or serves, its files
- security: the fleet's token, TLS files and Redis login, built once by the caller
- stop: set by SIGTERM or SIGINT (foundation.process.stop_event) or by the caller
- heartbeat: the Heartbeat the watchdog reads (a service beats every second)

A role returns a count once `stop` is set (env steps acked, gradients pushed, versions scored,
its last version). It cleans up in `finally` blocks, so an error and a SIGTERM end the same
way: every thread stopped, every client, server, file and env closed, and the first error is
the one raised.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from foundation.config import RunConfig
    from foundation.process import Heartbeat
    from foundation.transport import Security

E_contra = TypeVar("E_contra", contravariant=True)


class Role(Protocol[E_contra]):
    """The entry point of a role process (see the module docstring)."""

    def __call__(
        self,
        config: RunConfig,
        identity: int,
        endpoints: E_contra,
        security: Security,
        stop: threading.Event,
        heartbeat: Heartbeat,
        /,
    ) -> int: ...
