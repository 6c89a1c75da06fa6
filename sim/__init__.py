"""sim: the task registry (names, stable wire ids, dims), named task sets and domain randomization.

    >>> from sim import make_env, get_task, goal_reward
    >>> env = make_env("FetchPush-v4", RandomizationConfig())
    >>> get_task(env.spec.id).task_id
    1
    >>> task_set("mt10")                       # Meta-World's MT10: ten registry names

Talks to nothing but MuJoCo (through gymnasium / gymnasium_robotics, and Meta-World).
"""

from sim.randomization import DomainRandomization, RandomizationParams
from sim.registry import TASKS, TaskSpec, UnknownTaskError, get_task, goal_reward, goal_success, make_env
from sim.task_sets import TASK_SETS, UnknownTaskSetError, task_set

__all__ = [
    "TASKS",
    "TASK_SETS",
    "DomainRandomization",
    "RandomizationParams",
    "TaskSpec",
    "UnknownTaskError",
    "UnknownTaskSetError",
    "get_task",
    "goal_reward",
    "goal_success",
    "make_env",
    "task_set",
]
