"""sim: the task registry (names, stable wire ids, dims) and domain randomization.

    >>> from sim import make_env, get_task, goal_reward
    >>> env = make_env("FetchPush-v4", RandomizationConfig())
    >>> get_task(env.spec.id).task_id
    1

Talks to nothing but MuJoCo (through gymnasium / gymnasium_robotics).
"""

from sim.randomization import DomainRandomization, RandomizationParams
from sim.registry import TASKS, TaskSpec, UnknownTaskError, get_task, goal_reward, goal_success, make_env

__all__ = [
    "TASKS",
    "DomainRandomization",
    "RandomizationParams",
    "TaskSpec",
    "UnknownTaskError",
    "get_task",
    "goal_reward",
    "goal_success",
    "make_env",
]
