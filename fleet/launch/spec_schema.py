"""The fleet spec's format, as a JSON Schema checked at load (docs/fleet-spec.md describes it).

    lines = key_lines(text)                       # ("hosts", "sim-1", "sampler") -> 9
    check_schema(raw, "fleet.yaml", lines)        # ConfigError: fleet.yaml:9: hosts.sim-1.samplr: ...

An error names the file, the line, the key path, the value and what was expected; an unknown
key also gets the closest known one. The cross-host checks (one buffer, enough Redis nodes,
ports that collide) run after this one, in fleet/launch/spec.py.
"""

from __future__ import annotations

import difflib
from typing import Any

import jsonschema
import yaml

from foundation.config import ConfigError

MAX_REDIS_PORT = 55535  # the cluster bus takes port + 10000, which must stay below 65536

_PORT = {"type": "integer", "minimum": 1, "maximum": 65535, "description": "a TCP port in 1..65535"}
_CPUS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "description": "a CPU number (as taskset takes it)"},
    "description": "a list of CPU numbers the workers are pinned to",
}


def _service(role: str) -> dict[str, Any]:
    return {
        "description": f"the {role}'s port (a number, or {{port: N}}): this host serves the {role} there",
        "oneOf": [
            _PORT,
            {"type": "object", "properties": {"port": _PORT}, "required": ["port"], "additionalProperties": False},
        ],
    }


def _workers(role: str) -> dict[str, Any]:
    count = {"type": "integer", "minimum": 1, "description": f"how many {role} processes this host runs"}
    return {
        "description": f"a count of {role} processes (a number, or {{count: N, cpus: [..]}}), not a port",
        "oneOf": [
            count,
            {
                "type": "object",
                "properties": {"count": count, "cpus": _CPUS},
                "required": ["count"],
                "additionalProperties": False,
            },
        ],
    }


HOST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "a host: {address: ..., and the roles it runs}",
    "properties": {
        "address": {
            "type": "string",
            "minLength": 1,
            "description": "the host name or IP address the other hosts reach this host at",
        },
        "redis": {
            "type": "array",
            "items": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_REDIS_PORT,
                "description": f"a Redis node's port in 1..{MAX_REDIS_PORT} (its cluster bus takes port + 10000)",
            },
            "description": "the ports of this host's Redis Cluster nodes, one node per port",
        },
        "redis_dir": {
            "type": "string",
            "minLength": 1,
            "description": "a folder: where this host's Redis nodes keep their data (default <run_dir>/redis/<host>)",
        },
        "buffer": _service("buffer"),
        "aggregator": _service("aggregator"),
        "sampler": _workers("sampler"),
        "learner": _workers("learner"),
        "evaluator": _workers("evaluator"),
    },
    "required": ["address"],
    "additionalProperties": False,
}

_QUANTITY = {
    "type": "string",
    "pattern": r"^[1-9][0-9]*(Mi|Gi|Ti)$",
    "description": "a volume size as Kubernetes writes it: a whole number of Mi, Gi or Ti, e.g. 10Gi",
}

SLURM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Slurm settings: {warning_sec, requeue}",
    "properties": {
        "warning_sec": {
            "type": "integer",
            "minimum": 0,
            "maximum": 65535,
            "description": "seconds before the job's end Slurm warns the fleet to checkpoint and stop (0: none)",
        },
        "requeue": {"type": "boolean", "description": "true or false: requeue the job after a warning or preemption"},
    },
    "additionalProperties": False,
}

KUBERNETES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Kubernetes settings: {storage_class, run_volume_size, redis_volume_size}",
    "properties": {
        "storage_class": {
            "type": "string",
            "pattern": r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
            "description": "a StorageClass name ([a-z0-9.-]), or empty for the cluster's default",
        },
        "run_volume_size": _QUANTITY,
        "redis_volume_size": _QUANTITY,
    },
    "additionalProperties": False,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "fleetrl fleet spec",
    "type": "object",
    "description": "a fleet spec: {run_id, run_dir, config, redis_replicas, slurm, kubernetes, hosts}",
    "properties": {
        "run_id": {"type": "string", "minLength": 1, "description": "the run's name (its Redis keys, its run_dir)"},
        "run_dir": {"type": "string", "minLength": 1, "description": "the run directory on every host"},
        "config": {
            "type": "object",
            "propertyNames": {"pattern": r"^[a-z_]+(\.[a-z_]+)*$"},
            "description": "config overrides: section.field -> value (as --set section.field=value)",
        },
        "redis_replicas": {
            "type": "integer",
            "minimum": 0,
            "description": "replicas per Redis primary (0: primaries only)",
        },
        "slurm": SLURM_SCHEMA,
        "kubernetes": KUBERNETES_SCHEMA,
        "hosts": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": HOST_SCHEMA,
            "description": "a non-empty mapping of host name -> host",
        },
    },
    "required": ["hosts"],
    "additionalProperties": False,
}


def key_lines(text: str) -> dict[tuple[Any, ...], int]:
    """Every key path of a YAML document -> the 1-based line it starts on ({} if it is no YAML)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[tuple[Any, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[Any, ...]) -> None:
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, (*path, str(key.value)))
                lines[(*path, str(key.value))] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*path, index))

    if root is not None:
        walk(root, ())
    return lines


def where(source: str, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int] | None) -> str:
    """'fleet.yaml:9: hosts.sim-1.sampler' (the line when known, the key path when there is one)."""
    line = (lines or {}).get(tuple(str(p) if not isinstance(p, int) else p for p in path))
    place = f"{source}:{line}" if line else source
    return f"{place}: {'.'.join(map(str, path))}" if path else place


def check_schema(raw: Any, source: str, lines: dict[tuple[Any, ...], int] | None = None) -> None:
    """ConfigError naming the first problem (in document order) of `raw` against SCHEMA."""
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(raw))
    if not errors:
        return
    first = min(errors, key=lambda e: (lines or {}).get(_location(e), 0))
    raise _error(_precise(first), source, lines)


def _location(error: jsonschema.ValidationError) -> tuple[Any, ...]:
    """The key path an error is about: for an unknown key, that key."""
    path = tuple(error.absolute_path)
    schema, value = error.schema, error.instance
    if error.validator == "additionalProperties" and isinstance(value, dict) and isinstance(schema, dict):
        known = schema.get("properties", {})
        return (*path, next(str(k) for k in value if k not in known))
    return path


def _precise(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a value that fits one branch of a oneOf by type, that branch's own error."""
    if error.validator == "oneOf" and error.context:
        fitting = [e for e in error.context if not (e.validator == "type" and len(e.relative_schema_path) == 2)]
        if fitting:
            return _precise(fitting[0])
    return error


def _error(error: jsonschema.ValidationError, source: str, lines: dict[tuple[Any, ...], int] | None) -> ConfigError:
    path = tuple(error.absolute_path)
    schema: dict[str, Any] = dict(error.schema) if isinstance(error.schema, dict) else {}
    value: Any = error.instance
    if error.validator == "additionalProperties" and isinstance(value, dict):
        known = sorted(schema.get("properties", {}))
        key = _location(error)[-1]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return ConfigError(
            f"{where(source, (*path, key), lines)}: unknown key{hint} (known: {', '.join(known)})",
            field=".".join(map(str, (*path, key))),
        )
    if error.validator == "required":
        missing = next(k for k in schema["required"] if k not in value)
        return ConfigError(f"{where(source, path, lines)}: missing {missing!r}; expected {schema['description']}")
    if error.validator == "propertyNames":
        return ConfigError(f"{where(source, path, lines)}: keys must look like section.field ({error.message})")
    limits = {"minimum": ">=", "maximum": "<="}
    if error.validator in limits:
        limit = f"{limits[str(error.validator)]} {error.validator_value}"
        what = f": {schema['description']}" if "description" in schema else ""
        return ConfigError(f"{where(source, path, lines)} ({value!r}) must be {limit}{what}", field=_dotted(path))
    expected = schema.get("description", error.message)
    return ConfigError(f"{where(source, path, lines)} ({value!r}) must be {expected}", field=_dotted(path))


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))
