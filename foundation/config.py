"""Typed, frozen configuration: one dataclass per role, composed into `RunConfig`.

Only the CLI parses arguments; every library class takes one of these. Each field carries a
help line in its metadata (`fleetrl config` prints them; the docs' configuration reference
lists them). Cross-field checks run once, in `RunConfig.validate()`, at launch.

The sections live beside their loop: `config_experience.py` (sim, buffer, sampler),
`config_learning.py` (learner, model, aggregator); evaluation, supervision and security are
here. Import every config class and `ConfigError` from this module.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import typing
from dataclasses import dataclass, field
from typing import Any

from foundation.config_algos import ALGOS, upgrade_algorithm_fields
from foundation.config_base import Check, ConfigError, config_field, suggest
from foundation.config_experience import (
    EXPERT_TASKS,
    TASK_NAMES,
    BufferConfig,
    RandomizationConfig,
    SamplerConfig,
    SimConfig,
    tasks_overrides,
)
from foundation.config_learning import SCORED_SAMPLING, AggregatorConfig, LearnerConfig, ModelConfig

__all__ = [
    "AggregatorConfig",
    "BufferConfig",
    "ConfigError",
    "EvalConfig",
    "LearnerConfig",
    "ModelConfig",
    "RandomizationConfig",
    "RunConfig",
    "SCORED_SAMPLING",
    "SamplerConfig",
    "SecurityConfig",
    "SimConfig",
    "WatchdogConfig",
    "Change",
    "config_changes",
    "help_lines",
    "tasks_overrides",
    "with_overrides",
]


@dataclass(frozen=True)
class EvalConfig:
    episodes: int = config_field(
        50, "episodes of a full score, the only kind that can reach the target (ends early once out of reach)"
    )
    curve_episodes: int = config_field(
        10, "episodes of every curve score: a fixed budget, never cut short; a full score continues it"
    )
    final_episodes: int = config_field(
        50,
        "episodes of the last checkpoint's score when a run ends short of its target; 0 = none",
    )
    seed: int = config_field(1_000_000, "held-out seeds start here, far from every sampler's seeds")
    randomize: bool = config_field(False, "evaluate under domain randomization instead of the nominal task")
    measure: str = config_field(
        "field",
        "'field': as each task's benchmark scores it (Meta-World: any step of 500); 'training': the last step",
    )
    min_interval_sec: float = config_field(
        2.0, "seconds between scores early in a run and once curve success is within reach of the target"
    )
    max_interval_sec: float = config_field(60.0, "seconds between scores at most, while success is far off")
    near_max_interval_sec: float = config_field(
        16.0,
        "near the target, the longest wait between scores while none sets a new best",
    )
    interval_run_fraction: float = config_field(
        0.1,
        "far from the target, wait this fraction of the run's age between scores",
    )
    stop_early: bool = config_field(
        True, "end a score once target_success is out of reach (it then covers fewer episodes)"
    )
    nice: int = config_field(5, "niceness of the evaluator process: it scores on spare CPU first")
    max_core_share: float = config_field(
        0.1,
        "at most this share of one core on scoring, whatever the intervals say; 0 = no bound",
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.episodes >= 1, "episodes", ">= 1"),
            (self.final_episodes >= 0, "final_episodes", ">= 0"),
            (self.measure in ("field", "training"), "measure", "one of ('field', 'training')"),
            (
                0 <= self.seed and self.seed + max(self.episodes, self.final_episodes) <= 2**21,
                "seed",
                "in [0, 2**21 - eval.episodes (or eval.final_episodes)]: training episodes draw their seeds "
                "from 2**21 up",
            ),
            (
                1 <= self.curve_episodes <= self.episodes,
                "curve_episodes",
                "in [1, eval.episodes]: a full score continues the curve score's episodes",
            ),
            (0 <= self.min_interval_sec <= self.max_interval_sec, "min_interval_sec", "in [0, eval.max_interval_sec]"),
            (self.near_max_interval_sec >= 0, "near_max_interval_sec", ">= 0"),
            (self.interval_run_fraction >= 0, "interval_run_fraction", ">= 0"),
            (0 <= self.max_core_share <= 1, "max_core_share", "in [0, 1] (0 = no bound)"),
        ]


@dataclass(frozen=True)
class WatchdogConfig:
    """How the watchdog (fleetrl train, fleetrl fleet up) supervises every role process."""

    heartbeat_timeout_sec: float = config_field(
        60.0, "a role whose heartbeat is this old is taken as hung (SIGSTOP, deadlock) and restarted"
    )
    max_restarts: int = config_field(3, "restart budget: this many restarts of one role in a burst ...")
    restart_refill_sec: float = config_field(600.0, "... and one more every this many seconds, up to max_restarts")
    backoff_first_sec: float = config_field(1.0, "the 2nd restart in a row waits this long, each next twice as long")
    backoff_max_sec: float = config_field(30.0, "longest wait before a restart")

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.heartbeat_timeout_sec >= 3, "heartbeat_timeout_sec", ">= 3 (beats: 1-2 s)"),
            (self.max_restarts >= 0, "max_restarts", ">= 0"),
            (
                0 <= self.backoff_first_sec <= self.backoff_max_sec,
                "backoff_first_sec",
                "in [0, watchdog.backoff_max_sec]",
            ),
        ]


@dataclass(frozen=True)
class SecurityConfig:
    """Who may talk to the fleet. Secrets themselves never go into a config file: only paths."""

    enabled: bool = config_field(
        True, "false: no token, no Redis password, no TLS (a trusted single-user machine; benchmarks compare)"
    )
    token_file: str = config_field(
        "", "file holding the fleet token every RPC must carry; '' = the FLEETRL_TOKEN environment variable"
    )
    tls_cert: str = config_field("", "PEM server certificate (with tls_key): services serve TLS; see fleetrl certs")
    tls_key: str = config_field("", "PEM private key of tls_cert")
    tls_ca: str = config_field("", "PEM CA: clients verify services against it (and services verify clients)")
    tls_client_auth: bool = config_field(False, "services require client certificates signed by tls_ca")
    redis_user: str = config_field("fleetrl", "Redis ACL user of the run (the nodes fleetrl starts create it)")
    redis_password_file: str = config_field(
        "", "file holding the Redis password; '' = the FLEETRL_REDIS_PASSWORD environment variable"
    )


_CHECKED_SECTIONS = ("sim", "buffer", "sampler", "learner", "model", "aggregator", "eval", "watchdog")


@dataclass(frozen=True)
class RunConfig:
    run_id: str = config_field("run", "names the run's Redis keys and its run directory")
    run_dir: str = config_field("runs/run", "where config, checkpoints, TensorBoard events and summary go")
    target_success: float = config_field(0.9, "stop when the evaluator reports at least this success rate")
    max_wall_sec: float = config_field(600.0, "stop after this many seconds whatever the success")
    max_env_steps: int = config_field(0, "stop after this many env steps; 0 = no limit")
    preset: str = config_field("", "task preset applied under the overrides (fleetrl config shows it); '' = none")
    sim: SimConfig = field(default_factory=SimConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)

    def validate(self) -> RunConfig:
        """Every section's checks (each beside its fields), then the run's own; run once at
        launch. Returns self so calls can chain."""
        checks = [
            (ok, f"{name}.{field_name}", limit)
            for name in _CHECKED_SECTIONS
            for ok, field_name, limit in getattr(self, name).checks()
        ]
        for ok, name, limit in checks + self._run_checks():
            if not ok:
                raise ConfigError(f"{name} ({_get(self, name)!r}) must be {limit}", field=name)
        self._check_task()
        return self

    def _run_checks(self) -> list[Check]:
        """(ok, field, limit) of the checks across sections, each naming the field it refuses."""
        renorm = self.learner.algo in ALGOS and self.learner.algorithm().critics().renorm
        no_expert = [name for name in self.sim.tasks or (self.sim.task,) if name not in EXPERT_TASKS]
        return [
            (0.0 <= self.target_success <= 1.0, "target_success", "in [0, 1]"),
            (
                self.learner.task_min_share * max(len(self.sim.tasks), 1) <= 1.0,
                "learner.task_min_share",
                "in [0, 1 / the run's tasks]: every task's least share must fit in one batch",
            ),
            (
                self.sim.reward != "shaped" or self.sampler.her_k == 0,
                "sampler.her_k",
                "0 with sim.reward 'shaped': a shaped reward cannot be recomputed for a relabeled goal",
            ),
            (
                not (renorm and self.model.kind != "dense"),
                "model.kind",
                f"'dense' with learner.algo {self.learner.algo!r} (its batch-renormalized critics are dense)",
            ),
            (
                not (renorm and self.model.critic_norm != "none"),
                "model.critic_norm",
                f"'none' with learner.algo {self.learner.algo!r}: its critics batch-renormalize every layer already",
            ),
            (
                self.sampler.demo_episodes == 0 or not no_expert,
                "sampler.demo_episodes",
                f"0 for a run with {', '.join(no_expert)}: only Meta-World tasks have a scripted expert to "
                "demonstrate (sim/metaworld_experts.py)",
            ),
        ]

    def grads_per_step(self) -> int:
        """K, the gradients that close an aggregator step: aggregator.grads_per_step, where 0
        means every learner (learner.num_learners)."""
        return self.aggregator.grads_per_step or self.learner.num_learners

    def _check_task(self) -> None:
        if self.sim.task not in TASK_NAMES:
            raise ConfigError(
                f"sim.task ({self.sim.task!r}) must be a registered task{suggest(self.sim.task, TASK_NAMES)}",
                field="sim.task",
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return _from_dict(cls, upgrade_algorithm_fields(json.loads(text)))

    @classmethod
    def load(cls, path: str | pathlib.Path) -> RunConfig:
        return cls.from_json(pathlib.Path(path).read_text())


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown config field {cls.__name__}.{key}{suggest(key, names)}")
        kwargs[key] = _coerce(hints[key], value, f"{cls.__name__}.{key}")
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Turn a JSON value (or an override string parsed as JSON) into the field's type."""
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be an object, got {value!r}")
        return _from_dict(tp, value)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{where} must be a list of {len(args)} items, got {value!r}")
        return tuple(_coerce(t, v, where) for t, v in zip(args, value, strict=True))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(inner, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def with_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `section.field=value` overrides (value parsed as JSON, else taken as a string)."""
    data = dataclasses.asdict(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], dict):
                sections = [k for k, v in node.items() if isinstance(v, dict)]
                raise ConfigError(f"unknown config section {dotted!r}{suggest(part, sections)}")
            node = node[part]
        if parts[-1] not in node:
            raise ConfigError(f"unknown config field {dotted!r}{suggest(parts[-1], node)}")
        node[parts[-1]] = value
    return _from_dict(RunConfig, data)


def help_lines(config: Any = None, prefix: str = "", width: int = 0) -> list[str]:
    """One `name = value  # help` line per field of `config` (default: the built-in defaults),
    nested sections flattened; a value that differs from the built-in default is marked. With
    `width`, a help longer than the line has room for is cut at its first clause (short_help)."""
    config = RunConfig() if config is None else config
    lines = []
    for f in dataclasses.fields(config):
        name = prefix + f.name
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            lines.extend(help_lines(value, name + ".", width))
        else:
            mark = "" if value == f.default else f"  [default {f.default!r}]"
            head = f"{name} = {value!r}{mark}  # "
            help_text = f.metadata.get("help", "")
            lines.append(head + (short_help(help_text, width - len(head)) if width else help_text))
    return lines


MIN_HELP_CHARS = 24  # a help cut shorter than this says nothing; a long value's line runs over instead


def short_help(text: str, room: int) -> str:
    """`text` if it fits in `room` characters, else its first clause (up to the first '; ', ': ',
    ' (' or '. '), cut with '…' if that is still too long."""
    room = max(room, MIN_HELP_CHARS)
    if len(text) <= room:
        return text
    cuts = [i for i in (text.find(mark) for mark in ("; ", ": ", " (", ". ")) if i > 0]
    first = text[: min(cuts)] if cuts else text
    return first if len(first) <= room else first[: room - 1].rstrip() + "…"


class Change(typing.NamedTuple):
    """A config field whose value differs from the built-in default."""

    name: str  # section.field
    value: Any
    default: Any  # NOT_A_FIELD for a key the built-in config lacks (a config.json of another version)


NOT_A_FIELD = "(not a field of this version)"


def config_changes(config: RunConfig | dict[str, Any]) -> list[Change]:
    """Every field of `config` (a RunConfig, or a config.json's object) that differs from the
    built-in defaults, nested sections flattened, in field order: what `fleetrl config --changed`
    prints and `fleetrl report` shows."""
    data = dataclasses.asdict(config) if isinstance(config, RunConfig) else config
    return _changes(json.loads(json.dumps(data)), json.loads(json.dumps(dataclasses.asdict(RunConfig()))), "")


def _changes(data: dict[str, Any], defaults: dict[str, Any], prefix: str) -> list[Change]:
    changes = []
    for key, value in data.items():
        default = defaults.get(key, NOT_A_FIELD)
        if isinstance(value, dict) and isinstance(default, dict):
            changes += _changes(value, default, f"{prefix}{key}.")
        elif value != default:
            changes.append(Change(prefix + key, value, default))
    return changes
