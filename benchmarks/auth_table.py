"""Who gets in: every service called without the fleet's credentials, and what it left behind.

    python3 benchmarks/auth_table.py [--out benchmarks/results/auth_table.json]

Starts the real parts with security on, as `fleetrl train` does: a 3-node Redis Cluster
whose nodes require the run's ACL user and password, an ingest service and an aggregator
that require the fleet token. Then calls each of them without the token, with a wrong one,
and Redis without the password and with a wrong one, and reads back what changed: the
buffer's committed head, the aggregator's version and last evaluation, a Redis key.
A caller with the right credentials is served right after each refusal.

Prints LAST one row per case: the call, the status it got, what it changed (must be nothing),
and whether the service went on serving the fleet.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import grpc
import numpy as np
import redis
from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from aggregator.client import AggregatorClient, GradientPush
from aggregator.core import AggregatorCore
from aggregator.service import AggregatorServer
from buffer.ingest_client import IngestClient
from buffer.service import IngestServer
from buffer.storage import TemporalStorage
from fleet.launch.local_cluster import LocalRedisCluster
from foundation.config import AggregatorConfig, BufferConfig
from foundation.policy import GRADIENT_GROUPS, ModelSpec
from foundation.proto import fleetrl_pb2 as pb
from foundation.transport import Security
from foundation.wire import Transitions, TransitionSchema
from nets.models import norm_stats

RUN = "auth"
SCHEMA = TransitionSchema(obs_dim=10, goal_dim=3, act_dim=4)  # FetchReach-v4's sizes
SPEC = ModelSpec(10, 3, 4, (32, 32))
BUFFER = BufferConfig(window_size_transitions=64, capacity_transitions=4096)
CALLERS = {"no token": Security(), "wrong token": Security(token="guessed")}


def transitions(n: int) -> Transitions:
    rng = np.random.default_rng(0)
    f = lambda d: rng.normal(size=(n, d)).astype(np.float32)  # noqa: E731
    action = np.tanh(f(SCHEMA.act_dim)).astype(np.float32)
    return Transitions(f(SCHEMA.obs_dim), f(SCHEMA.goal_dim), action, -np.ones(n, np.float32), f(SCHEMA.obs_dim),
                       np.zeros(n, np.float32))  # fmt: skip


def gradient(core: AggregatorCore) -> GradientPush:
    rng = np.random.default_rng(1)
    grads = {g: rng.normal(size=core.sizes[g]).astype(np.float32) * 1e-3 for g in GRADIENT_GROUPS}
    return GradientPush(0, core.version, grads, norm_stats(rng.normal(size=(8, SPEC.input_dim))), batch_size=8)


def refused(call) -> str:
    try:
        call()
    except grpc.RpcError as err:
        return err.code().name
    except redis.RedisError as err:
        return type(err).__name__
    return "OK"  # served: a refusal case that gets this is a hole


class SecuredServices:
    """The ingest service and the aggregator with security on, and callers of each."""

    def __init__(
        self, storage: TemporalStorage, core: AggregatorCore, ingest: IngestServer, aggregator: AggregatorServer
    ):
        self.storage, self.core, self.ingest, self.aggregator = storage, core, ingest, aggregator
        self._seq = iter(range(1, 1000))

    def push(self, security: Security) -> None:
        with IngestClient(self.ingest.address, sampler_id=1, run_id=RUN, security=security) as c:
            c.push(transitions(50), seq=next(self._seq), policy_version=0, task_id=0, env_steps=50, max_retry_sec=2)

    def call_aggregator(self, security: Security, what: str) -> None:
        with AggregatorClient(self.aggregator.address, timeout_sec=3.0, security=security) as c:
            if what == "PushGradients":
                c.push_gradients(gradient(self.core))
            elif what == "Stats":
                c.stats()
            elif what == "ReportEval":  # a forged "target reached"
                c._stub.ReportEval(pb.EvalReport(episodes=50, success_rate=1.0, kind="full"), timeout=3)
            else:
                next(iter(c._stub.WatchWeights(pb.WatchRequest(subscriber="x"), timeout=3)))

    def state(self) -> dict:
        """What a call let through would change: the buffer's head, the version, the last evaluation."""
        return {"buffer_head": self.storage.head(), "version": self.core.version,
                "last_eval_episodes": self.aggregator.servicer.last_eval.episodes}  # fmt: skip


def service_rows(services: SecuredServices, fleet: Security) -> list[dict]:
    """Each gRPC call without the token and with a wrong one: status, what changed, served after."""
    rows = []
    for who, caller in CALLERS.items():
        for service, call in (
            ("ingest Push", lambda c=caller: services.push(c)),
            ("aggregator PushGradients", lambda c=caller: services.call_aggregator(c, "PushGradients")),
            ("aggregator ReportEval", lambda c=caller: services.call_aggregator(c, "ReportEval")),
            ("aggregator WatchWeights", lambda c=caller: services.call_aggregator(c, "WatchWeights")),
        ):
            before = services.state()
            status = refused(call)
            after = services.state()
            changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
            serving = refused(
                lambda s=service: services.push(fleet) if "ingest" in s else services.call_aggregator(fleet, "Stats")
            )
            rows.append({"call": f"{service}, {who}", "status": status, "changed": changed or "nothing",
                         "still_serving": serving == "OK"})  # fmt: skip
    return rows


def redis_rows(cluster: LocalRedisCluster, client: redis.RedisCluster) -> list[dict]:
    """FLUSHALL on a Redis node without the password and with a wrong one: was the data kept?"""
    rows = []
    host, port = cluster.nodes[0]
    client.set("{auth}:probe", b"kept")
    for who, password in (("no password", None), ("wrong password", "guess")):
        intruder = redis.Redis(host=host, port=port, password=password)
        status = refused(intruder.flushall)
        intruder.close()
        kept = client.get("{auth}:probe") == b"kept"
        rows.append({"call": f"Redis FLUSHALL, {who}", "status": status,
                     "changed": "nothing" if kept else "DATA LOST", "still_serving": kept})  # fmt: skip
    return rows


def auth_rows() -> list[dict]:
    """Start the secured parts (as `fleetrl train` does) and call each without credentials."""
    fleet = Security(token="the-fleet-token", redis_user="fleetrl", redis_password="the-redis-password-" + "x" * 12)
    with LocalRedisCluster(auth=fleet) as cluster, tempfile.TemporaryDirectory() as run_dir:
        client = cluster.client()
        storage = TemporalStorage(client, RUN, SCHEMA, BUFFER)
        config = AggregatorConfig(checkpoint_every_versions=1000)
        core = AggregatorCore(SPEC, config, grads_per_step=1, max_staleness=1)
        with (
            IngestServer(storage, task_ids=(0,), schema=SCHEMA, run_id=RUN, config=BUFFER, security=fleet) as ingest,
            AggregatorServer(core, config, run_dir=run_dir, security=fleet) as aggregator,
        ):
            rows = service_rows(SecuredServices(storage, core, ingest, aggregator), fleet)
            rows += redis_rows(cluster, client)
        client.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the raw result (JSON) here")
    args = p.parse_args(argv)
    rows = auth_rows()
    ok = all(r["status"] != "OK" and r["changed"] == "nothing" and r["still_serving"] for r in rows)
    if args.out:
        write_result(result_record("auth_table", {"rows": rows, "all_refused_nothing_changed": ok}), args.out)
    table = {r["call"]: {"status": r["status"], "changed": str(r["changed"]), "still serving": r["still_serving"]}
             for r in rows}  # fmt: skip
    print_table("who gets in", table)
    print(f"all refused, nothing changed, still serving: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
