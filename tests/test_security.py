"""Authentication over real gRPC and a real Redis: tokens, TLS, the Redis password, and what a
refused caller leaves behind (nothing)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import redis

from aggregator.client import AggregatorClient
from aggregator.core import AggregatorCore
from aggregator.service import AggregatorServer
from buffer.ingest_client import IngestClient
from buffer.service import IngestServer
from buffer.storage import TemporalStorage
from fleet.launch.local_cluster import LocalRedisCluster
from foundation.certs import make_certs
from foundation.config import AggregatorConfig, BufferConfig, SecurityConfig
from foundation.proto import fleetrl_pb2 as pb
from foundation.transport import Security, SecurityError
from tests.conftest import SMALL_SCHEMA
from tests.helpers import SPEC, push

RUN = "auth"
TOKEN = Security(token="right-token")
WRONG = Security(token="wrong-token")
NONE = Security()
BUFFER = BufferConfig(window_size_transitions=8, capacity_transitions=64)


@pytest.fixture
def ingest(redis_client):
    storage = TemporalStorage(redis_client, RUN, SMALL_SCHEMA, BUFFER)
    with IngestServer(
        storage, task_ids=(0,), schema=storage.layout.schema, run_id=RUN, config=BUFFER, security=TOKEN
    ) as server:
        yield server


def _push(server, security: Security, make_transitions):
    with IngestClient(server.address, sampler_id=1, run_id=RUN, security=security) as client:
        return client.push(make_transitions(4), seq=1, policy_version=0, task_id=0, env_steps=4, max_retry_sec=2)


@pytest.mark.parametrize("caller,why", [(NONE, "missing fleet token"), (WRONG, "wrong fleet token")])
def test_a_push_without_the_right_token_is_refused_and_stores_nothing(ingest, caller, why, make_transitions):
    with pytest.raises(grpc.RpcError) as err:
        _push(ingest, caller, make_transitions)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and why in err.value.details()
    assert ingest.servicer.storage.head() == 0
    assert ingest.servicer.counters().rejected_by_reason == {"authorization": 1}
    assert _push(ingest, TOKEN, make_transitions).stored == 4  # and it keeps serving the fleet


@pytest.fixture
def aggregator(tmp_path):
    config = AggregatorConfig(lr=1e-2, checkpoint_every_versions=1000)
    with AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path, security=TOKEN) as srv:
        yield srv


def test_gradients_evals_and_weights_need_the_token(aggregator, tmp_path):
    core = aggregator.servicer.core
    with AggregatorClient(aggregator.address, timeout_sec=3.0, security=WRONG) as intruder:
        with pytest.raises(grpc.RpcError) as err:
            intruder.push_gradients(push(core, 0))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            intruder.push_gradients_async(push(core, 0)).result(retry=False)  # the learners' stream
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        forged = pb.EvalReport(version=0, episodes=50, success_rate=1.0, kind="full")  # "target reached"
        with pytest.raises(grpc.RpcError) as err:
            intruder.report_eval(forged)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stream = intruder._stub.WatchWeights(pb.WatchRequest(subscriber="x"), timeout=3)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(stream))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert core.version == 0 and not (tmp_path / "evals.jsonl").exists()
    assert aggregator.refused.total == 4
    with AggregatorClient(aggregator.address, timeout_sec=3.0, security=TOKEN) as fleet:
        assert fleet.push_gradients_async(push(core, 0)).result().version == 1
        assert fleet.stats().last_eval.episodes == 0


def test_tls_with_the_fleet_ca_works_and_plain_text_is_refused(tmp_path):
    paths = make_certs(tmp_path / "certs", hosts=[])
    config = SecurityConfig(
        tls_cert=str(paths["fleet.pem"]), tls_key=str(paths["fleet.key"]), tls_ca=str(paths["ca.pem"])
    )
    security = Security.from_config(config, environ={"FLEETRL_TOKEN": "t"})
    agg_config = AggregatorConfig(lr=1e-2)
    with AggregatorServer(AggregatorCore(SPEC, agg_config, 1, 1), agg_config, security=security) as srv:
        address = f"localhost:{srv.port}"
        with AggregatorClient(address, timeout_sec=3.0, security=security) as agg:
            assert agg.push_gradients(push(srv.servicer.core, 0)).version == 1
        with AggregatorClient(address, timeout_sec=2.0, security=Security(token="t")) as plain:
            with pytest.raises(grpc.RpcError) as err:
                plain.stats(timeout_sec=2.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_certificates_are_required_when_configured(tmp_path):
    paths = make_certs(tmp_path / "certs", hosts=[])
    files = {"tls_cert": str(paths["fleet.pem"]), "tls_key": str(paths["fleet.key"]), "tls_ca": str(paths["ca.pem"])}
    server_side = Security.from_config(SecurityConfig(**files, tls_client_auth=True), environ={})
    no_client_cert = Security(tls_ca=paths["ca.pem"].read_bytes())
    agg_config = AggregatorConfig(lr=1e-2)
    with AggregatorServer(AggregatorCore(SPEC, agg_config, 1, 1), agg_config, security=server_side) as srv:
        with AggregatorClient(f"localhost:{srv.port}", timeout_sec=3.0, security=server_side) as agg:
            assert agg.stats().version == 0
        with AggregatorClient(f"localhost:{srv.port}", timeout_sec=2.0, security=no_client_cert) as anon:
            with pytest.raises(grpc.RpcError):
                anon.stats(timeout_sec=2.0)


@pytest.mark.parametrize(
    "config,message",
    [
        (SecurityConfig(tls_cert="/x.pem"), "tls_cert and security.tls_key come together"),
        (SecurityConfig(token_file="/no/such/token"), "security.token_file ('/no/such/token') cannot be read"),
        (SecurityConfig(tls_client_auth=True), "tls_client_auth needs security.tls_ca"),
    ],
)
def test_unusable_security_settings_name_the_field(config, message):
    with pytest.raises(SecurityError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Security.from_config(config, environ={})


def test_the_token_comes_from_a_file_or_the_environment(tmp_path):
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert (
        Security.from_config(SecurityConfig(token_file=str(path)), environ={"FLEETRL_TOKEN": "env"}).token
        == "from-file"
    )
    assert Security.from_config(SecurityConfig(), environ={"FLEETRL_TOKEN": "env"}).token == "env"


def test_redis_nodes_started_with_a_password_refuse_anyone_without_it():
    auth = Security(redis_user="fleetrl", redis_password="pw-" + "x" * 20)
    with LocalRedisCluster(auth=auth) as cluster:
        client = cluster.client()
        client.set("{r}:k", b"v")
        assert client.get("{r}:k") == b"v"
        client.close()
        host, port = cluster.nodes[0]
        for anonymous in (redis.Redis(host=host, port=port), redis.Redis(host=host, port=port, password="guess")):
            with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
                anonymous.flushall()
            anonymous.close()
        data = np.frombuffer(cluster.client().get("{r}:k") or b"", np.uint8)
        assert data.tobytes() == b"v"  # nothing the intruder tried took effect


def test_health_and_reflection_answer_probes_without_the_token(aggregator):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(aggregator.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fleetrl.v1.Aggregator"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        aggregator.standard.set_serving(False)
        reply = health.Check(health_pb2.HealthCheckRequest(service="fleetrl.v1.Aggregator"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as err:  # reflection, like every fleet call, needs the token
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            next(iter(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with TOKEN.channel(aggregator.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        reply = next(iter(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
        names = {s.name for s in reply.list_services_response.service}
        assert {"fleetrl.v1.Aggregator", "grpc.health.v1.Health"} <= names
