"""Named sets of tasks, for a run of several: `task_set("mt10")` gives Meta-World's MT10.

    >>> from sim.task_sets import task_set
    >>> task_set("mt10")[:2]
    ('MetaWorld-reach-v3', 'MetaWorld-push-v3')
    >>> TaskSet.of(task_set("mt10"))        # sim/tasks.py: the run's tasks at one width

A set is a tuple of registry names (sim/registry.py), in the order its benchmark lists them;
the order is a run's task order (the one-hot and the per-task scores follow it).
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from foundation.errors import FleetrlError
from sim.registry import TASKS

TASK_SETS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        # Meta-World's MT10 (metaworld.MT10: env_dict.MT10_V3's order).
        "mt10": tuple(
            f"MetaWorld-{name}-v3"
            for name in (
                "reach",
                "push",
                "pick-place",
                "door-open",
                "drawer-open",
                "drawer-close",
                "button-press-topdown",
                "peg-insert-side",
                "window-open",
                "window-close",
            )
        ),
        "fetch": ("FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4", "FetchSlide-v4"),
    }
)
"""Every named set, by its lower-case name."""

_unregistered = sorted({n for names in TASK_SETS.values() for n in names} - set(TASKS))
if _unregistered:
    raise RuntimeError(f"sim.task_sets: tasks the registry does not hold: {_unregistered}")


class UnknownTaskSetError(FleetrlError, ValueError):
    """A task set's name is not in TASK_SETS; the message lists the known sets."""


def task_set(name: str) -> tuple[str, ...]:
    """The registry names of the task set `name` (case-insensitive, e.g. "mt10" or "MT10").

    >>> task_set("mt11")   # UnknownTaskSetError: unknown task set 'mt11'; known sets: fetch (4 tasks), mt10 (10 tasks)
    """
    names = TASK_SETS.get(name.strip().lower()) if isinstance(name, str) else None
    if names is None:
        known = ", ".join(f"{key} ({len(tasks)} tasks)" for key, tasks in sorted(TASK_SETS.items()))
        raise UnknownTaskSetError(f"unknown task set {name!r}; known sets: {known}")
    return names
