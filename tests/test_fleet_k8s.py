"""`fleetrl fleet render --k8s`: manifests from a spec, checked against the Kubernetes schemas
(kubernetes-validate ships them: offline). No cluster runs them here."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from fleet.launch.k8s import manifests, write_manifests
from fleet.launch.spec import parse_spec
from foundation.config import ConfigError, RunConfig, with_overrides
from tests.test_fleet_spec import README_SPEC

K8S_VERSION = "1.30.0"  # a version every maintained cluster has reached


def _objects(text: str = README_SPEC, **overrides: object) -> list[dict]:
    spec = parse_spec(yaml.safe_load(text))
    config = spec.config(with_overrides(RunConfig(), [f"{k}={v}" for k, v in overrides.items()]))
    return manifests(spec, config, image="fleetrl:test")


def _by(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_every_manifest_passes_the_kubernetes_schema_strictly():
    objects = _objects()
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("ConfigMap", "big-config"),
        ("Service", "big-redis"),
        ("StatefulSet", "big-redis"),
        ("Job", "big-redis-join"),
        ("PersistentVolumeClaim", "big-run"),
        ("Service", "big-buffer"),
        ("Service", "big-aggregator"),
        ("Job", "big-services"),
        ("Job", "big-sim-1"),
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda o: o["spec"].update(completions="one"),
        lambda o: o["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicie="Always"),
        lambda o: o["spec"]["template"]["spec"]["containers"][0]["readinessProbe"].update(grpc={"port": "x"}),
    ],
)
def test_the_schema_check_refuses_a_broken_manifest(break_it):
    job = _by(_objects(), "Job", "big-services")
    break_it(job)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_each_host_is_one_pod_with_a_container_per_role_and_fleet_unique_ids():
    objects = _objects()
    sim = _by(objects, "Job", "big-sim-1")["spec"]["template"]
    names = [c["name"] for c in sim["spec"]["containers"]]
    assert names == [f"sampler-{i}" for i in range(8)] + ["learner-0"]
    sampler = sim["spec"]["containers"][3]["command"]
    assert sampler[sampler.index("--buffer") + 1] == "big-buffer:50051"
    assert sampler[sampler.index("--aggregator") + 1] == "big-aggregator:50052"
    metrics = [p["containerPort"] for c in sim["spec"]["containers"] for p in c["ports"]]
    assert metrics == list(range(9100, 9109))  # one Prometheus port per role process
    annotations = sim["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9100"
    assert annotations["fleetrl/metrics-ports"] == ",".join(map(str, metrics))


def test_services_select_their_pod_and_are_probed_over_grpc_health():
    objects = _objects()
    services = _by(objects, "Job", "big-services")
    buffer = _by(objects, "Service", "big-buffer")
    assert buffer["spec"]["selector"] == services["spec"]["template"]["metadata"]["labels"]
    assert buffer["spec"]["ports"][0]["port"] == 50051
    probes = {c["name"]: c.get("readinessProbe") for c in services["spec"]["template"]["spec"]["containers"]}
    assert probes == {
        "buffer": {"grpc": {"port": 50051}, "periodSeconds": 5},
        "aggregator": {"grpc": {"port": 50052}, "periodSeconds": 5},
        "evaluator-0": None,
    }
    volumes = {v["name"]: v for v in services["spec"]["template"]["spec"]["volumes"]}
    assert volumes["run"]["persistentVolumeClaim"]["claimName"] == "big-run"  # checkpoints outlive the pod


def test_secrets_come_from_the_secret_by_name_and_never_inline():
    objects = _objects()
    assert "Secret" not in {o["kind"] for o in objects}
    envs = [
        e
        for o in objects
        if o["kind"] in ("StatefulSet", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if e["name"].startswith("FLEETRL_")
    ]
    assert envs and all("value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == "big-secrets" for e in envs)
    redis = _by(objects, "StatefulSet", "big-redis")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ">$(FLEETRL_REDIS_PASSWORD)" in redis  # the kubelet fills it in from the Secret


def test_the_redis_cluster_is_one_pod_per_node_formed_by_a_job_with_the_specs_replicas():
    hosts = README_SPEC.replace("redis: [7002]", "redis: [7002, 7003, 7004, 7005]")
    objects = _objects(hosts.replace("run_id: big", "run_id: big\nredis_replicas: 1"))
    assert _by(objects, "StatefulSet", "big-redis")["spec"]["replicas"] == 6
    join = _by(objects, "Job", "big-redis-join")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert join[join.index("--replicas") + 1] == "1"
    assert join[join.index("--join") + 1].split(",")[5] == "big-redis-5.big-redis.default.svc.cluster.local:6379"
    config = _by(objects, "ConfigMap", "big-config")["data"]["config.json"]
    assert RunConfig.from_json(config).buffer.replicas_to_ack == 1


def test_a_service_serving_tls_gets_a_tcp_probe_since_the_grpc_probe_is_plaintext():
    objects = _objects(**{"security.tls_cert": '"/certs/fleet.pem"', "security.tls_key": '"/certs/fleet.key"'})
    buffer = _by(objects, "Job", "big-services")["spec"]["template"]["spec"]["containers"][0]
    assert buffer["readinessProbe"]["tcpSocket"] == {"port": 50051}


def test_each_host_is_a_job_that_completes_when_its_roles_exit_and_restarts_a_failed_one():
    objects = _objects()
    hosts = [o for o in objects if o["kind"] == "Job" and o["metadata"]["labels"].get("fleetrl/role") == "host"]
    assert [h["metadata"]["name"] for h in hosts] == ["big-services", "big-sim-1"]
    for host in hosts:
        spec = host["spec"]
        assert (spec["completions"], spec["parallelism"]) == (1, 1) and spec["backoffLimit"] >= 1
        assert spec["template"]["spec"]["restartPolicy"] == "OnFailure"  # a role that exits 0 stays done
    assert "Deployment" not in {o["kind"] for o in objects}  # nothing the kubelet restarts after the fleet stops


def test_the_configmap_holds_the_config_as_a_readable_yaml_block(tmp_path):
    spec = parse_spec(yaml.safe_load(README_SPEC))
    config = spec.config()
    paths = write_manifests(spec, config, tmp_path / "k8s")
    text = paths[0].read_text()
    assert "  config.json: |\n" in text and '    "run_id": "big",\n' in text  # one field a line
    assert RunConfig.from_json(yaml.safe_load(text)["data"]["config.json"]) == config


def test_written_files_are_the_objects_as_plain_yaml(tmp_path):
    spec = parse_spec(yaml.safe_load(README_SPEC))
    config = spec.config()
    paths = write_manifests(spec, config, tmp_path / "k8s")
    assert [p.name for p in paths][:2] == ["00-configmap-big-config.yaml", "01-service-big-redis.yaml"]
    for path, obj in zip(paths, manifests(spec, config), strict=True):
        text = path.read_text()
        assert "&id" not in text and yaml.safe_load(text) == obj


def test_a_run_id_kubernetes_cannot_take_as_a_name_is_refused():
    with pytest.raises(ConfigError, match="gives no Kubernetes name"):
        _objects(README_SPEC.replace("run_id: big", f"run_id: {'x' * 70}"))


def test_the_redis_pods_and_the_run_directory_keep_their_data_on_claims_so_a_rescheduled_pod_resumes():
    objects = _objects()
    redis = _by(objects, "StatefulSet", "big-redis")["spec"]
    claim = redis["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data" and "volumes" not in redis["template"]["spec"]  # no emptyDir
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi" and "storageClassName" not in claim["spec"]
    assert redis["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    node = redis["template"]["spec"]["containers"][0]
    assert node["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    command = node["command"]
    assert command[command.index("--appendonly") + 1] == "yes" and "/data/nodes.conf" in command
    assert _by(objects, "PersistentVolumeClaim", "big-run")["spec"]["resources"]["requests"]["storage"] == "10Gi"
    # The aggregator's pod, wherever it is rescheduled: the run claim, where it resumes from its newest checkpoint.
    services = _by(objects, "Job", "big-services")["spec"]["template"]["spec"]
    assert {"name": "run", "persistentVolumeClaim": {"claimName": "big-run"}} in services["volumes"]
    aggregator = next(c for c in services["containers"] if c["name"] == "aggregator")
    assert {"name": "run", "mountPath": "/run/fleetrl"} in aggregator["volumeMounts"]
    assert aggregator["command"][aggregator["command"].index("--run-dir") + 1] == "/run/fleetrl"


def test_the_storage_class_and_sizes_come_from_the_spec_and_a_throwaway_buffer_takes_no_claim():
    text = README_SPEC + "kubernetes: {storage_class: fast-ssd, run_volume_size: 50Gi, redis_volume_size: 8Gi}\n"
    objects = _objects(text)
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    run = _by(objects, "PersistentVolumeClaim", "big-run")["spec"]
    assert (run["storageClassName"], run["resources"]["requests"]["storage"]) == ("fast-ssd", "50Gi")
    claim = _by(objects, "StatefulSet", "big-redis")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert (claim["storageClassName"], claim["resources"]["requests"]["storage"]) == ("fast-ssd", "8Gi")
    throwaway = _by(_objects(**{"buffer.durable": "false"}), "StatefulSet", "big-redis")["spec"]
    assert "volumeClaimTemplates" not in throwaway
    assert throwaway["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    command = throwaway["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--appendonly") + 1] == "no"
