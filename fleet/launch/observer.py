"""What may watch a running local fleet from the launcher's loop (fleet/launch/local_fleet.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fleet.launch.local_cluster import LocalRedisCluster
    from fleet.launch.watchdog import Watchdog


class FleetObserver(Protocol):
    """Watches a running local fleet from the launcher's loop (benchmarks/chaos_soak.py injects
    faults this way). Every call runs on the launcher's thread and must return quickly: the
    watchdog is not polled meanwhile.

        fleet.run(observer)   # observer.tick(dog, cluster) every loop (0.25 s); once the stop
                              # rule fired: observer.stopping(...), and once the workers
                              # stopped: observer.workers_stopped(...)
    """

    def tick(self, dog: Watchdog, cluster: LocalRedisCluster) -> str | None:
        """Called every loop; a reason (a string) ends the run as the stop rule would."""

    def stopping(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        """The stop rule fired; the fleet stops next (a fault injector resumes what it paused)."""

    def workers_stopped(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        """The samplers, learners and evaluator have stopped (their ledgers are complete); the
        services and Redis still run: the last moment to read what Redis holds."""


class Unobserved:
    """Watches nothing: a run without an observer."""

    def tick(self, dog: Watchdog, cluster: LocalRedisCluster) -> str | None:
        return None

    def stopping(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        pass

    def workers_stopped(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        pass
