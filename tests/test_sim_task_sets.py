"""sim.task_sets: named sets of registry tasks (Meta-World's MT10 first)."""

from __future__ import annotations

import metaworld
import pytest

from sim.registry import get_task
from sim.task_sets import TASK_SETS, UnknownTaskSetError, task_set
from sim.tasks import TaskSet


def test_mt10_is_metaworlds_own_mt10_in_its_order():
    own = [f"MetaWorld-{name}" for name in metaworld.env_dict.MT10_V3]  # metaworld.MT10's tasks
    assert list(task_set("mt10")) == own and len(own) == 10
    assert task_set("MT10") == task_set(" mt10 ")


@pytest.mark.parametrize("name", sorted(TASK_SETS))
def test_every_set_builds_one_task_set_of_registered_tasks(name):
    tasks = TaskSet.of(task_set(name))
    assert tasks.names == task_set(name)
    assert all(get_task(n).name == n for n in tasks.names)


@pytest.mark.parametrize("bad", ["mt11", "", "mt-10"])
def test_an_unknown_set_is_refused_naming_the_known_ones(bad):
    with pytest.raises(UnknownTaskSetError, match=f"unknown task set {bad!r}; known sets: fetch \\(4 tasks\\), mt10"):
        task_set(bad)
