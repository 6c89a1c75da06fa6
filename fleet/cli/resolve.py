"""From a command line to what a command works on: the RunConfig, the task names, the run directory.

    request = config_request(args, before=spec.overrides)   # what the user asked for; args untouched
    config = resolve_config(request)                        # presets under it, the user's --set on top
    config = with_run_dir(config, request)                  # runs/<task>-<timestamp> unless one was named
    run_dir = existing_run_dir(args.run_dir)                 # ConfigError naming the path, not a traceback

Every check here runs at the door: a message names the argument, the value and what would fit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

from foundation.config import ConfigError, RunConfig, tasks_overrides, with_overrides
from foundation.config_base import suggest
from foundation.config_experience import TASK_NAMES

SHORTHANDS = {  # the flag's attribute -> the config field it sets
    "task": "sim.task",
    "run_id": "run_id",
    "samplers": "sampler.num_samplers",
    "learners": "learner.num_learners",
    "target_success": "target_success",
    "max_wall_sec": "max_wall_sec",
}


@dataclass(frozen=True)
class ConfigRequest:
    """What a command line asks of the config: a resolved config file (or the built-in defaults
    and the presets) and `section.field=value` overrides applied in order."""

    config_path: str | None
    overrides: tuple[str, ...]

    def names(self, field: str) -> bool:
        """Whether an override sets `field`."""
        return any(item.split("=", 1)[0].strip() == field for item in self.overrides)


def config_request(
    args: argparse.Namespace, before: Sequence[str] = (), after: Sequence[str] = (), config_path: str | None = None
) -> ConfigRequest:
    """The request of `args` (--config, --set and the shorthands), with `before` under the user's
    --set (a fleet spec's config) and `after` on top of everything."""
    overrides = [*before, *args.set]
    for attr, dotted in SHORTHANDS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{dotted}={json.dumps(value)}")
    if getattr(args, "task", None) is not None:
        check_task_name(args.task, "--task")
    if getattr(args, "tasks", None) is not None:
        tasks = split_tasks(args.tasks)
        overrides += tasks_overrides(tasks)
    if getattr(args, "seed", None) is not None:
        overrides += [f"sampler.seed={args.seed}", f"aggregator.seed={args.seed}"]
    return ConfigRequest(config_path or args.config, (*overrides, *after))


def resolve_config(request: ConfigRequest) -> RunConfig:
    """The config a command runs with: a config file's (presets included, as `fleetrl config
    --json` writes it) or the task's preset under the overrides, which always win. Task names
    are checked here, with the closest registered name suggested."""
    if request.config_path:
        config = with_overrides(load_config(request.config_path, "--config"), list(request.overrides))
    else:
        from fleet.cli.presets import preset_for

        overrides = list(request.overrides)
        config = with_overrides(preset_for(with_overrides(RunConfig(), overrides), overrides), overrides)
    check_task_name(config.sim.task, "sim.task")
    for task in config.sim.tasks:
        check_task_name(task, "sim.tasks")
    return config


def load_config(path: str | pathlib.Path, what: str) -> RunConfig:
    """RunConfig.load with a ConfigError naming `what` and the path when the file is missing or no config."""
    file = pathlib.Path(path)
    if file.is_dir():
        raise ConfigError(f"{what} {file}: a folder, not a RunConfig JSON (a run directory's is {file}/config.json)")
    if not file.is_file():
        raise ConfigError(f"{what} {file}: no such file (a RunConfig JSON, as `fleetrl config --json` writes)")
    try:
        return RunConfig.load(file)
    except (ValueError, TypeError) as err:  # JSONDecodeError, ConfigError: the file is not a RunConfig
        raise ConfigError(f"{what} {file}: not a RunConfig JSON: {err}") from err


def default_run_dir(config: RunConfig, now: datetime.datetime | None = None) -> str:
    """runs/<task>-<timestamp>: where `fleetrl train` writes a run no run directory was named for."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"runs/{config.sim.task}-{stamp}"


def with_run_dir(config: RunConfig, request: ConfigRequest) -> RunConfig:
    """`config` with the run directory `train` uses: the one the request names, else default_run_dir."""
    import dataclasses

    if request.names("run_dir"):
        return config
    return dataclasses.replace(config, run_dir=default_run_dir(config))


def check_task_name(task: str, what: str) -> None:
    """ConfigError for a task name that is not registered, with the closest one suggested."""
    if task not in TASK_NAMES:
        raise ConfigError(f"{what} {task!r} is not a registered task{suggest(task, TASK_NAMES)}", field=what)


def split_tasks(text: str) -> list[str]:
    """--tasks A,B,C as a list of registered tasks, none empty and none twice; an item may name a
    task set (sim/task_sets.py: "mt10" is Meta-World's MT10), which stands for its tasks in order."""
    tasks: list[str] = []
    for index, item in enumerate(part.strip() for part in text.split(",")):
        if not item:
            raise ConfigError(
                f"--tasks {text!r}: item {index + 1} is empty; give registered task names separated by single commas",
                field="--tasks",
            )
        tasks.extend([item] if item in TASK_NAMES else _task_set(item))
    if twice := sorted({t for t in tasks if tasks.count(t) > 1}):
        raise ConfigError(
            f"--tasks {text!r}: {', '.join(twice)} named twice; a run trains each task once", field="--tasks"
        )
    return tasks


def _task_set(name: str) -> tuple[str, ...]:
    """The tasks of the task set `name`; ConfigError naming the tasks and sets it is close to."""
    from sim.task_sets import TASK_SETS  # only for a name that is not a task: sim loads MuJoCo

    named = TASK_SETS.get(name.lower())
    if named is None:
        choices = [*TASK_NAMES, *TASK_SETS]
        raise ConfigError(
            f"--tasks {name!r} is not a registered task or task set{suggest(name, choices)}", field="--tasks"
        )
    return named


def existing_run_dir(path: str, need: str = "config.json") -> pathlib.Path:
    """A run directory that exists and holds `need` (a file or folder); ConfigError naming the path."""
    run_dir = pathlib.Path(path)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir}: does not exist (a folder `fleetrl train` wrote)")
    if not (run_dir / need).exists():
        raise ConfigError(f"run directory {run_dir}: no {need} there (not a run directory, or a run not started)")
    return run_dir


def last_checkpoint_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """RUN_DIR/checkpoints when it holds a checkpoint; ConfigError naming the folder otherwise."""
    folder = existing_run_dir(str(run_dir), "config.json") / "checkpoints"
    if not folder.is_dir() or not any(folder.glob("ckpt_*.pt")):
        raise ConfigError(f"run directory {run_dir}: no checkpoint in {folder} (the run wrote none yet)")
    return folder
