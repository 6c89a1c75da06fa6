"""A fleet spec as Kubernetes manifests: `fleetrl fleet render fleet.yaml --out k8s/`.

    objects = manifests(spec, config, image="fleetrl:latest")   # plain dicts, one per object
    write_manifests(spec, config, "k8s/")                       # one YAML file per object
    next_steps(spec, config, "k8s/", "default")                 # the Secret to create, kubectl apply

What a spec becomes (docs/fleet-spec.md, "Kubernetes"):
- the Redis nodes of every host: one StatefulSet (one pod per node, port 6379, bus 16379) with
  a headless Service, and a Job that forms them into one cluster (`fleetrl redis-cluster --join`);
  with buffer.durable each pod keeps its append-only file and nodes.conf on a claim of its own
  (`kubernetes.redis_volume_size`), so a rescheduled pod comes back as the same node with its data;
- every host with services or workers: one Job of one pod (`completions: 1`), a container per
  role process; the kubelet restarts a container that fails (`restartPolicy: OnFailure`, in place
  of the watchdog, up to HOST_BACKOFF_LIMIT times), and one that exits 0 stays done, so when the
  fleet stops (its target, a cap) every role exits 0, each host's Job completes and the fleet ends;
- Services for the buffer and the aggregator, probed with Kubernetes' gRPC probes against the
  grpc.health.v1 service they serve (health calls need no token);
- the run's config as a ConfigMap (config.json as a YAML block, one field a line); the fleet
  token and Redis password from the Secret `<run>-secrets` (keys `token`, `redis-password`),
  referenced by name, never written here;
- the aggregator's run directory (checkpoints, evals.jsonl, tb/) on a PersistentVolumeClaim
  (`kubernetes.run_volume_size`, `kubernetes.storage_class`): a rescheduled aggregator pod
  resumes from the newest checkpoint there, under a version past every one it broadcast.
Nothing here has run on a cluster; the manifests are checked against the Kubernetes schemas.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import yaml

from fleet.launch.spec_checks import REDIS_BUS_OFFSET, redis_layout
from fleet.launch.spec_model import FleetSpec, HostSpec, VolumeSettings
from foundation.config import ConfigError, RunConfig
from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV

REDIS_PORT = 6379  # every Redis pod has its own address, so every node takes Redis' usual port
METRICS_PORT = 9100  # the first role's Prometheus port in a pod; the next roles take the next ones
CONFIG_DIR = "/etc/fleetrl"
RUN_DIR = "/run/fleetrl"
HOST_BACKOFF_LIMIT = 20  # container restarts of a host's pod before its Job fails (a role that keeps dying)
Obj = dict[str, Any]


def name(*parts: str) -> str:
    """A DNS-1123 name from spec names: lower case, [a-z0-9-], at most 63 characters."""
    text = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if not text or len(text) > 63:
        raise ConfigError(f"{'-'.join(parts)!r} gives no Kubernetes name of 1..63 characters ([a-z0-9-])")
    return text


class Names:
    """Every object's name, from the run id."""

    def __init__(self, spec: FleetSpec, namespace: str) -> None:
        self.run = name(spec.run_id)
        self.namespace = namespace
        self.secret = f"{self.run}-secrets"
        self.config = f"{self.run}-config"
        self.redis = f"{self.run}-redis"
        self.run_volume = f"{self.run}-run"

    def service(self, role: str) -> str:
        return f"{self.run}-{role}"

    def redis_nodes(self, count: int) -> str:
        """The `--redis` addresses: every Redis pod's stable name under the headless Service."""
        domain = f"{self.redis}.{self.namespace}.svc.cluster.local"
        return ",".join(f"{self.redis}-{i}.{domain}:{REDIS_PORT}" for i in range(count))


def manifests(
    spec: FleetSpec, config: RunConfig, image: str = "fleetrl:latest", namespace: str = "default"
) -> list[Obj]:
    """Every object of the fleet, in the order `kubectl apply` should meet them."""
    names = Names(spec, namespace)
    hosts = [h for h in spec.hosts if h.services or h.workers]
    if len({name(names.run, h.name) for h in hosts}) != len(hosts):
        raise ConfigError(f"hosts {[h.name for h in hosts]}: two give the same Kubernetes name")
    objects = [_meta(names, "ConfigMap", names.config, data={"config.json": config.to_json() + "\n"})]
    objects += _redis(spec, config, names, image)
    objects.append(_run_volume(names, spec.kubernetes))
    for role in ("buffer", "aggregator"):
        owner = next(h for h in spec.hosts if role in h.services)
        objects.append(_service(names, role, owner, owner.services[role]))
    objects += [_host(spec, config, names, image, host) for host in hosts]
    return objects


def write_manifests(
    spec: FleetSpec,
    config: RunConfig,
    out: str | pathlib.Path,
    image: str = "fleetrl:latest",
    namespace: str = "default",
) -> list[pathlib.Path]:
    """One YAML file per object in `out`, numbered in apply order; returns their paths."""
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, obj in enumerate(manifests(spec, config, image, namespace)):
        path = folder / f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.dump(obj, Dumper=_Dumper, sort_keys=False))
        paths.append(path)
    return paths


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a dict used twice (a probe's check) is written twice, not as an anchor; a
    string of several lines (the ConfigMap's config.json) as a block, a line of YAML per line."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _block_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _block_str)


def next_steps(spec: FleetSpec, config: RunConfig, out: str | pathlib.Path, namespace: str) -> list[str]:
    """The commands that start the rendered fleet: the Secret (with security on), apply, wait, clean up."""
    names = Names(spec, namespace)
    steps = []
    if config.security.enabled:
        steps.append(
            f"kubectl -n {namespace} create secret generic {names.secret} "
            '--from-literal=token="$(openssl rand -hex 32)" --from-literal=redis-password="$(openssl rand -hex 32)"'
            "   # the fleet's token and Redis password: never in the manifests"
        )
    steps.append(f"kubectl apply -f {out}")
    steps.append(
        f"kubectl -n {namespace} wait --for=condition=complete job -l fleetrl/role=host --timeout=-1s"
        "   # every host's Job completes when the fleet stops"
    )
    steps.append(f"kubectl delete -f {out}   # the Redis nodes and the rest; the run volume's claim too")
    if config.buffer.durable:
        steps.append(
            f"kubectl -n {namespace} delete pvc -l fleetrl/redis={names.redis}   # the Redis nodes' data (kept)"
        )
    return steps


def _meta(names: Names, kind: str, obj_name: str, **body: Any) -> Obj:
    api = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1"}.get(kind, "v1")
    labels = {"app.kubernetes.io/name": "fleetrl", "app.kubernetes.io/instance": names.run}
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": obj_name, "namespace": names.namespace, "labels": labels},
        **body,
    }


def _secret_env(names: Names, config: RunConfig) -> list[Obj]:
    """The token and the Redis password from the Secret, as the variables every role reads."""
    if not config.security.enabled:
        return []
    keys = ((TOKEN_ENV, "token"), (REDIS_PASSWORD_ENV, "redis-password"))
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": names.secret, "key": key}}} for var, key in keys]


def _redis_argv(config: RunConfig) -> list[str]:
    """A Redis pod's command: a cluster node announcing its pod IP, its files under /data (with
    buffer.durable an append-only file, written before each reply: fleet/launch/local_cluster.py)."""
    durable = config.buffer.durable
    argv = ["redis-server", "--port", str(REDIS_PORT), "--cluster-enabled", "yes", "--cluster-config-file",
            "/data/nodes.conf", "--cluster-node-timeout", "5000", "--cluster-announce-ip", "$(POD_IP)",
            "--dir", "/data", "--appendonly", "yes" if durable else "no", "--appendfsync", "no",
            "--save", ""]  # fmt: skip
    if config.security.enabled:  # the run's ACL user, the default user off (as fleet/launch/local_cluster.py does)
        user = config.security.redis_user
        argv += ["--protected-mode", "yes", "--user", "default", "off", "--user", user, "on",
                 f">$({REDIS_PASSWORD_ENV})", "~*", "&*", "+@all", "--masteruser", user,
                 "--masterauth", f"$({REDIS_PASSWORD_ENV})"]  # fmt: skip
    else:
        argv += ["--protected-mode", "no"]
    return argv


def _redis(spec: FleetSpec, config: RunConfig, names: Names, image: str) -> list[Obj]:
    count = len(spec.redis_nodes)
    selector = {"fleetrl/redis": names.redis}
    durable = config.buffer.durable  # each node's append-only file and nodes.conf on a claim of its own
    ports = [{"name": "redis", "port": REDIS_PORT}, {"name": "bus", "port": REDIS_PORT + REDIS_BUS_OFFSET}]
    headless = _meta(
        names,
        "Service",
        names.redis,
        spec={"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector, "ports": ports},
    )
    argv = _redis_argv(config)
    probe = {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 10}
    container = {
        "name": "redis",
        "image": image,
        "command": argv,
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *[e for e in _secret_env(names, config) if e["name"] == REDIS_PASSWORD_ENV],
        ],  # fmt: skip
        "ports": [{"name": p["name"], "containerPort": p["port"]} for p in ports],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod = {"containers": [container], **({} if durable else {"volumes": [{"name": "data", "emptyDir": {}}]})}
    body = {
        "serviceName": names.redis,
        "replicas": count,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": selector}, "spec": pod},
    }
    if durable:  # a claim per pod, kept when the pod is rescheduled and when the StatefulSet goes
        claim = _claim(spec.kubernetes.redis_volume_size, spec.kubernetes.storage_class)
        body["volumeClaimTemplates"] = [{"metadata": {"name": "data", "labels": selector}, "spec": claim}]
        body["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain", "whenScaled": "Retain"}
    stateful = _meta(names, "StatefulSet", names.redis, spec=body)
    return [headless, stateful, _redis_join(spec, config, names, image)]


def _redis_join(spec: FleetSpec, config: RunConfig, names: Names, image: str) -> Obj:
    """A Job that forms the StatefulSet's nodes into one cluster (a formed cluster is left as it is)."""
    layout = redis_layout(spec)
    argv = ["fleetrl", "redis-cluster", "--join", names.redis_nodes(len(spec.redis_nodes)),
            "--replicas", str(spec.redis_replicas), "--redis-user", config.security.redis_user]  # fmt: skip
    container = {"name": "join", "image": image, "command": argv, "env": _secret_env(names, config)}
    pod = {"restartPolicy": "OnFailure", "containers": [container]}
    job = _meta(
        names,
        "Job",
        f"{names.redis}-join",
        spec={"backoffLimit": 20, "template": {"metadata": {"labels": {"fleetrl/job": "redis-join"}}, "spec": pod}},
    )
    job["metadata"]["annotations"] = {"fleetrl/primaries": str(len(layout.primaries))}
    return job


def _claim(size: str, storage_class: str) -> Obj:
    """A claim's spec: one node reads and writes it; "" takes the cluster's default StorageClass."""
    claim: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        claim["storageClassName"] = storage_class
    return claim


def _run_volume(names: Names, volumes: VolumeSettings) -> Obj:
    claim = _claim(volumes.run_volume_size, volumes.storage_class)
    return _meta(names, "PersistentVolumeClaim", names.run_volume, spec=claim)


def _service(names: Names, role: str, owner: HostSpec, port: int) -> Obj:
    selector = {"fleetrl/host": name(names.run, owner.name)}
    ports = [{"name": "grpc", "port": port, "targetPort": port, "appProtocol": "grpc"}]
    return _meta(names, "Service", names.service(role), spec={"selector": selector, "ports": ports})


def _host(spec: FleetSpec, config: RunConfig, names: Names, image: str, host: HostSpec) -> Obj:
    """One pod of one container per role process; the aggregator's pod keeps the run directory."""
    label = name(names.run, host.name)
    containers = [_container(config, names, image, host, argv) for argv in _role_argvs(spec, names, host)]
    for index, container in enumerate(containers):
        metrics = METRICS_PORT + index
        container["command"] += ["--metrics", f"0.0.0.0:{metrics}"]
        container["ports"].append({"name": f"metrics-{index}", "containerPort": metrics})
    run = {"persistentVolumeClaim": {"claimName": names.run_volume}} if "aggregator" in host.services else {}
    volumes = [{"name": "config", "configMap": {"name": names.config}}, {"name": "run", **(run or {"emptyDir": {}})}]
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
        # The annotation above names one port; every role's is listed here (ports metrics-N).
        "fleetrl/metrics-ports": ",".join(str(METRICS_PORT + i) for i in range(len(containers))),
    }
    template = {
        "metadata": {"labels": {"fleetrl/host": label}, "annotations": annotations},
        "spec": {"restartPolicy": "OnFailure", "containers": containers, "volumes": volumes},
    }
    body = {
        "completions": 1,  # worker ids are fixed per host: never two pods of one host
        "parallelism": 1,
        "backoffLimit": HOST_BACKOFF_LIMIT,
        "template": template,
    }
    job = _meta(names, "Job", label, spec=body)
    job["metadata"]["labels"]["fleetrl/role"] = "host"
    return job


def _role_argvs(spec: FleetSpec, names: Names, host: HostSpec) -> list[list[str]]:
    """Each role process's command line, as fleet/launch/spec.py's FleetHost.roles builds it."""
    buffer = f"{names.service('buffer')}:{_port(spec, 'buffer')}"
    aggregator = f"{names.service('aggregator')}:{_port(spec, 'aggregator')}"
    redis = names.redis_nodes(len(spec.redis_nodes))
    acks = f"{RUN_DIR}/{host.name}/acks"
    needs = {
        "buffer": ["--redis", redis],
        "aggregator": ["--run-dir", RUN_DIR],
        "sampler": ["--buffer", buffer, "--aggregator", aggregator, "--ack-log", acks],
        "learner": ["--redis", redis, "--aggregator", aggregator],
        "evaluator": ["--buffer", buffer, "--aggregator", aggregator],
    }
    config = ["--config", f"{CONFIG_DIR}/config.json"]
    argvs = []
    for role, port in host.services.items():
        advertise = f"{names.service(role)}:{port}"
        argvs.append(["fleetrl", role, *config, "--listen", f"0.0.0.0:{port}", "--advertise", advertise, *needs[role]])
    for role, workers in host.workers.items():
        first = spec.first_id(host, role)
        for index in range(first, first + workers.count):
            argvs.append(["fleetrl", role, *config, "--id", str(index), *needs[role]])
    return argvs


def _port(spec: FleetSpec, role: str) -> int:
    return next(h.services[role] for h in spec.hosts if role in h.services)


def _container(config: RunConfig, names: Names, image: str, host: HostSpec, argv: list[str]) -> Obj:
    role = argv[1]
    ident = argv[argv.index("--id") + 1] if "--id" in argv else ""
    threads = [{"name": var, "value": "1"} for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")]
    container: Obj = {
        "name": f"{role}-{ident}" if ident else role,
        "image": image,
        "command": argv,
        "env": [*_secret_env(names, config), *threads],
        "ports": [],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR}, {"name": "run", "mountPath": RUN_DIR}],
    }
    if role in host.services:
        port = host.services[role]
        container["ports"].append({"name": f"grpc-{role}", "containerPort": port})  # names are unique per pod
        # Kubernetes' gRPC probe speaks plaintext; a service serving TLS gets a TCP probe instead.
        check = {"tcpSocket": {"port": port}} if config.security.tls_cert else {"grpc": {"port": port}}
        container["readinessProbe"] = {**check, "periodSeconds": 5}
        container["livenessProbe"] = {**check, "periodSeconds": 10, "failureThreshold": 6}
    return container
