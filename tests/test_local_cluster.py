"""LocalRedisCluster: a real cluster forms, spreads keys, and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
import redis.cluster

from fleet.launch import cluster_admin, local_cluster
from fleet.launch.cluster_admin import LocalClusterError
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.watchdog import Watchdog
from foundation.config import WatchdogConfig
from foundation.transport import Security, connect, parse_addresses
from tests.conftest import wait_until
from tests.helpers import poll_until

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def test_cluster_has_three_primaries_all_ok(redis_cluster):
    assert len(redis_cluster.nodes) >= 3
    assert redis_cluster.addresses == ",".join(f"{h}:{p}" for h, p in redis_cluster.nodes)
    for host, port in redis_cluster.nodes:
        node = redis.Redis(host=host, port=port)
        info = node.execute_command("CLUSTER", "INFO").decode()
        assert "cluster_state:ok" in info
        assert "cluster_slots_ok:16384" in info
        assert f"cluster_size:{len(redis_cluster.nodes)}" in info
        node.close()


def test_keys_with_different_hash_tags_land_on_different_nodes(redis_client):
    ports = set()
    for i in range(12):
        key = f"{{tag{i}}}:value"
        redis_client.set(key, i)
        assert int(redis_client.get(key)) == i
        ports.add(redis_client.get_node_from_key(key).port)
    assert len(ports) >= 3


def test_connect_parses_addresses_and_reaches_the_cluster(clean_redis_cluster):
    client = connect(clean_redis_cluster.addresses)
    client.set("{a}:x", b"1")
    assert client.get("{a}:x") == b"1"
    client.close()


@pytest.mark.parametrize("addresses", ["", " , ", "127.0.0.1", "127.0.0.1:", ":6379", "host:port", "h:70000", "h:0"])
def test_connect_rejects_malformed_addresses(addresses):
    with pytest.raises(ValueError, match="host:port"):
        parse_addresses(addresses)


def test_parse_addresses_accepts_several():
    assert parse_addresses("127.0.0.1:7000, localhost:7001") == [("127.0.0.1", 7000), ("localhost", 7001)]


def test_close_stops_every_process_and_removes_the_directory():
    cluster = LocalRedisCluster(num_primaries=3).start()
    pids = cluster.pids
    assert all(_alive(p) for p in pids)
    tmp = Path(cluster._tmp.name)  # the directory's path, to check it is gone
    cluster.close()
    wait_until(lambda: not [p for p in pids if _alive(p)], 2.0, f"pids {pids} to exit", interval_sec=0.05)
    assert not tmp.exists()
    cluster.close()  # idempotent


def test_nodes_die_with_a_killed_parent(tmp_path):
    pid_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import time
        from fleet.launch.local_cluster import LocalRedisCluster
        cluster = LocalRedisCluster().start()
        open({str(pid_file)!r} + ".tmp", "w").write(",".join(map(str, cluster.pids)))
        import os; os.replace({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.05)
        pids = [int(p) for p in pid_file.read_text().split(",")]
        assert all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)  # no cleanup code runs: only PDEATHSIG can help
        parent.wait()
    wait_until(lambda: not [p for p in pids if _alive(p)], 5.0, f"pids {pids} to exit", interval_sec=0.05)


def test_missing_redis_server_gives_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalClusterError, match="sudo apt-get install -y redis-server"):
        LocalRedisCluster().start()


def test_fewer_than_three_primaries_is_refused():
    with pytest.raises(ValueError, match="num_primaries \\(2\\) must be >= 3"):
        LocalRedisCluster(num_primaries=2)


def test_nodes_bind_and_announce_the_given_host_on_fixed_ports():
    ports = []
    for _ in range(3):  # three free ports whose bus ports (+10000) are free too, on 127.0.0.2
        ports.append(local_cluster.free_port_pair(set(ports), "127.0.0.2"))
    with LocalRedisCluster(host="127.0.0.2", ports=ports, appendonly=True) as cluster:
        assert cluster.nodes == [("127.0.0.2", p) for p in ports]
        client = cluster.client()
        client.set("{h}:k", b"v")
        announced = {node.host for node in client.get_nodes()}  # what the cluster told the client
        client.close()
        assert announced == {"127.0.0.2"}
        with socket.socket() as s:  # bound to 127.0.0.2 only: 127.0.0.1 on the same port refuses
            assert s.connect_ex(("127.0.0.1", ports[0])) != 0


def test_replicas_follow_the_primaries_and_one_takes_over_a_killed_primary():
    with LocalRedisCluster(num_primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        assert len(cluster.nodes) == 6 and cluster.primaries == cluster.nodes[:3]
        client = cluster.client()
        client.set("{r}:k", b"v")
        node = client.get_node_from_key("{r}:k")
        assert client.execute_command("WAIT", 1, 2000, target_nodes=node) == 1  # a replica holds it
        primary_pid = dict(zip(cluster.nodes, cluster.pids, strict=True))[(node.host, node.port)]
        os.kill(primary_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # a bound against hanging, not a timing check
        while True:
            try:
                assert client.get("{r}:k") == b"v"  # from the promoted replica
                break
            except (redis.RedisError, redis.cluster.RedisClusterException):
                assert time.monotonic() < deadline, "no replica took over"
                time.sleep(0.2)
        client.close()


def test_replica_ports_are_counted_with_the_primaries():
    with pytest.raises(ValueError, match="one port per node \\(6: primaries, then replicas\\)"):
        LocalRedisCluster(num_primaries=3, replicas=1, ports=[7000, 7001, 7002])


def _role(conn: redis.Redis) -> str:
    role = conn.execute_command("ROLE")[0]
    return role.decode() if isinstance(role, bytes) else role


def test_a_supervised_node_killed_without_a_replica_is_restarted_and_holds_its_slots_again(tmp_path):
    config = WatchdogConfig(heartbeat_timeout_sec=60.0)
    with LocalRedisCluster(num_primaries=3) as cluster, Watchdog(tmp_path / "logs", events_path=tmp_path / "ev") as dog:
        cluster.supervise(dog, config)
        host, port = cluster.nodes[1]
        conn = redis.Redis(host=host, port=port)
        node_id = conn.execute_command("CLUSTER", "MYID")
        os.kill(dog.pids()[f"redis-{port}"], signal.SIGKILL)
        events = poll_until(dog, lambda _: cluster_admin.cluster_ok(cluster.nodes, cluster.auth))
        assert any(e.startswith(f"redis-{port} exited with code -9") for e in events), events
        assert conn.execute_command("CLUSTER", "MYID") == node_id  # rejoined as itself, from nodes.conf
        assert _role(conn) == "master"
        client = cluster.client()
        for i in range(50):  # every slot is served again, the restarted node's included
            client.set(f"{{k{i}}}", i)
        client.close()
        conn.close()
    assert json.loads((tmp_path / "ev").read_text().splitlines()[0])["role"] == f"redis-{port}"


def test_a_supervised_primary_that_hangs_is_replaced_by_its_replica_and_rejoins_as_a_replica(tmp_path):
    """SIGSTOP: the node no longer answers. Its replica takes over after the node timeout; the
    watchdog restarts the hung node after the heartbeat timeout; it comes back as a replica."""
    config = WatchdogConfig(heartbeat_timeout_sec=3.0)
    with (
        LocalRedisCluster(num_primaries=3, replicas=1, node_timeout_ms=1000) as cluster,
        Watchdog(tmp_path / "logs", startup_grace_sec=0.0) as dog,
    ):
        cluster.supervise(dog, config)
        host, port = cluster.primaries[0]
        pid = dog.pids()[f"redis-{port}"]
        os.kill(pid, signal.SIGSTOP)
        events = poll_until(dog, lambda _: dog.pids()[f"redis-{port}"] != pid)
        assert any(e.startswith(f"redis-{port} stopped sending heartbeats") for e in events), events
        conn = redis.Redis(host=host, port=port)
        poll_until(dog, lambda _: cluster_admin.answers(host, port, cluster.auth) and _role(conn) == "slave")
        poll_until(dog, lambda _: cluster_admin.cluster_ok(cluster.nodes, cluster.auth))
        promoted = [n for n in cluster.nodes[3:] if _role(redis.Redis(host=n[0], port=n[1])) == "master"]
        assert len(promoted) == 1, promoted  # the old primary's replica
        conn.close()


def test_a_supervised_primary_killed_keeps_what_its_replica_acked_through_the_restart(tmp_path):
    """Found by the chaos soak (benchmarks/chaos_soak.py: 23 of 72 acked batches lost). The
    watchdog restarted a SIGKILLed primary within a poll, before its replica took over; the node
    came back empty as the primary of its slots (no persistence), and its replica copied the
    empty data set: writes acked after WAIT 1 were gone. The node must come back only once its
    replica has taken over, and then as that replica's replica."""
    with (
        LocalRedisCluster(num_primaries=3, replicas=1) as cluster,  # the fleet's node timeout (5 s)
        Watchdog(tmp_path / "logs", startup_grace_sec=0.0) as dog,
    ):
        cluster.supervise(dog, WatchdogConfig())
        client = cluster.client()
        node = client.get_node_from_key("{r}:k")
        for i in range(100):
            client.set(f"{{r}}:k{i}", i)
        assert client.execute_command("WAIT", 1, 2000, target_nodes=node) == 1  # a replica holds them all
        pid = dog.pids()[f"redis-{node.port}"]
        os.kill(pid, signal.SIGKILL)
        events = poll_until(dog, lambda _: cluster_admin.cluster_ok(cluster.nodes, cluster.auth) and
                            dog.pids()[f"redis-{node.port}"] != pid)  # fmt: skip
        conn = redis.Redis(host=node.host, port=node.port)
        poll_until(dog, lambda _: cluster_admin.answers(node.host, node.port, cluster.auth) and _role(conn) == "slave")
        conn.close()
        assert [client.get(f"{{r}}:k{i}") for i in range(100)] == [str(i).encode() for i in range(100)], events
        client.close()


NODES_BEFORE_FAILOVER = """\
d307 127.0.0.1:7001@17001 master - 0 1796149298000 2 connected 5461-10921
14a2 127.0.0.1:7000@17000 myself,master - 0 1796149298000 1 connected 0-5460
f07a 127.0.0.1:7004@17004 slave d307 0 1796149298000 2 connected
3cf5 127.0.0.1:7003@17003 slave 14a2 0 1796149298000 1 connected
"""
NODES_AFTER_FAILOVER = """\
f07a 127.0.0.1:7004@17004 master - 0 1796149298000 6 connected 5461-10921
14a2 127.0.0.1:7000@17000 myself,master - 0 1796149298000 1 connected 0-5460
3cf5 127.0.0.1:7003@17003 slave 14a2 0 1796149298000 1 connected
d307 127.0.0.1:7001@17001 master,fail - 1796149290990 1796149289000 2 disconnected
"""


@pytest.mark.parametrize(
    ("view", "port", "safe"),
    [
        (NODES_BEFORE_FAILOVER, 7001, False),  # a primary with slots and a replica: wait for the failover
        (NODES_AFTER_FAILOVER, 7001, True),  # its replica took its slots
        (NODES_BEFORE_FAILOVER, 7004, True),  # a replica: nothing of its own to wipe
        (NODES_AFTER_FAILOVER, 7000, False),
        (NODES_AFTER_FAILOVER.replace("slave 14a2", "slave f07a"), 7000, True),  # a primary with no replica
        (NODES_AFTER_FAILOVER, 7999, True),  # a node the view does not know
    ],
)
def test_a_dead_node_may_restart_unless_it_is_a_primary_whose_replica_has_not_taken_over(view, port, safe):
    assert cluster_admin.restart_is_safe(view, "127.0.0.1", port) is safe


def test_nodes_of_several_hosts_form_one_cluster_with_replicas():
    """What `fleet up` does with `redis_replicas: 1`: each host starts its nodes unformed, the
    first Redis host forms them: the first half primaries, the second half their replicas."""
    with LocalRedisCluster(3, form=False) as host_a, LocalRedisCluster(3, form=False) as host_b:
        nodes = host_a.nodes + host_b.nodes
        cluster_admin.form_cluster(nodes, host_a.auth, replicas=1)
        assert cluster_admin.cluster_ok(nodes, host_a.auth)
        conns = [redis.Redis(host=h, port=p) for h, p in nodes]
        roles = [_role(conn) for conn in conns]
        for conn in conns:
            conn.close()
        assert roles == ["master"] * 3 + ["slave"] * 3
        client = connect(host_a.addresses)
        client.set("{f}:k", b"v")
        node = client.get_node_from_key("{f}:k")
        assert client.execute_command("WAIT", 1, 2000, target_nodes=node) == 1  # a replica holds it
        client.close()


def test_join_forms_running_nodes_by_name_with_the_password_from_the_environment(monkeypatch, capsys):
    """`fleetrl redis-cluster --join`: what the Kubernetes Job runs against the Redis pods."""
    from fleet.cli.main import main
    from foundation.transport import REDIS_PASSWORD_ENV, Security

    auth = Security(redis_user="fleetrl", redis_password="pw")
    with LocalRedisCluster(3, form=False, auth=auth) as nodes:
        monkeypatch.setenv(REDIS_PASSWORD_ENV, "pw")
        by_name = ",".join(f"localhost:{port}" for _, port in nodes.nodes)  # names, resolved to IPs
        assert main(["redis-cluster", "--join", by_name]) == 0
        assert "cluster of 3 nodes ok" in capsys.readouterr().out
        assert cluster_admin.cluster_ok(nodes.nodes, auth)


# Two writes in one script: the append-only file holds them as a MULTI/EXEC block, as it holds
# the buffer's reserve and commit scripts.
_TWO_WRITES = "redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('HSET', KEYS[2], 'seq', ARGV[1])"


@pytest.mark.parametrize("passwords", [(None, None), ("first", "second")], ids=["open", "new password"])
def test_a_kept_cluster_killed_whole_starts_again_on_other_ports_with_its_data(tmp_path, passwords):
    """data_dir: every node SIGKILLed at once (no shutdown, no save), then started on ports none
    of them had, and (as each `fleetrl train` makes one) another password: the same node ids
    hold the same slots and every acked write, string values grown by SETRANGE (the buffer's
    windows) and a script's writes included."""
    data = tmp_path / "redis"
    auths = [Security(redis_user="fleetrl", redis_password=p) if p else Security() for p in passwords]
    window = b"".join(i.to_bytes(4, "little") for i in range(4096))
    with LocalRedisCluster(appendonly=True, data_dir=data, auth=auths[0]) as first:
        client = first.client()
        for i in range(64):
            client.setrange(f"{{w{i}}}:window", 0, window[: 256 * (1 + i % 16)])
            client.eval(_TWO_WRITES, 2, "{run}:head", "{run}:dedup", i)
        client.close()
        ids = [cluster_admin.node_client(h, p, auths[0]).execute_command("CLUSTER", "MYID") for h, p in first.nodes]
        old_ports = {p for _, p in first.nodes}
        for pid in first.pids:
            os.kill(pid, signal.SIGKILL)
    ports = []
    for _ in range(3):
        ports.append(local_cluster.free_port_pair(old_ports | set(ports)))
    again = LocalRedisCluster(appendonly=True, data_dir=data, ports=ports, auth=auths[1])
    assert again.kept_nodes()
    with again:
        assert [cluster_admin.node_client(h, p, auths[1]).execute_command("CLUSTER", "MYID")
                for h, p in again.nodes] == ids  # fmt: skip
        client = again.client()
        assert [client.getrange(f"{{w{i}}}:window", 0, -1) for i in range(64)] == [
            window[: 256 * (1 + i % 16)] for i in range(64)
        ]
        assert (int(client.get("{run}:head")), client.hget("{run}:dedup", "seq")) == (sum(range(64)), b"63")
        client.close()
    assert sorted(p.name for p in data.iterdir()) == ["node0", "node1", "node2"]  # kept after close


def test_a_data_dir_holding_another_cluster_shape_is_refused_naming_the_folder(tmp_path):
    data = tmp_path / "redis"
    with LocalRedisCluster(appendonly=True, data_dir=data):
        pass
    with pytest.raises(LocalClusterError, match=f"{data} holds the cluster state of nodes"):
        LocalRedisCluster(appendonly=True, data_dir=data, replicas=1).start()


def test_a_data_dir_without_appendonly_is_refused():
    with pytest.raises(ValueError, match="data_dir .* with appendonly"):
        LocalRedisCluster(data_dir=Path("kept"))


def _identities(nodes: list[tuple[str, int]], auth: Security) -> list[tuple[bytes, str]]:
    """(node id, role) of every node, in order."""
    found = []
    for host, port in nodes:
        conn = cluster_admin.node_client(host, port, auth)
        found.append((conn.execute_command("CLUSTER", "MYID"), _role(conn)))
        conn.close()
    return found


def test_kept_nodes_of_two_hosts_meet_again_on_their_data_and_half_of_them_is_refused(tmp_path):
    """What a requeued `fleet up` does: each host starts its nodes unformed on its redis_dir, the
    first Redis host meets them again on other ports; the slots, roles and data are as they were.
    A host whose folder is gone would join empty nodes to them: refused, naming both halves."""
    auth = Security(redis_user="fleetrl", redis_password="pw")
    kept = {"appendonly": True, "form": False, "auth": auth}
    with (
        LocalRedisCluster(3, data_dir=tmp_path / "a", **kept) as a,
        LocalRedisCluster(3, data_dir=tmp_path / "b", **kept) as b,
    ):
        cluster_admin.form_cluster(a.nodes + b.nodes, auth, replicas=1)
        client = connect(a.addresses, auth)
        client.set("{run}:head", 4096)
        client.close()
        before = _identities(a.nodes + b.nodes, auth)
        taken = {p for _, p in a.nodes + b.nodes}
    ports: list[int] = []
    for _ in range(6):
        ports.append(local_cluster.free_port_pair(taken | set(ports)))
    with (
        LocalRedisCluster(3, data_dir=tmp_path / "a", ports=ports[:3], **kept) as a,
        LocalRedisCluster(3, data_dir=tmp_path / "b", ports=ports[3:], **kept) as b,
    ):
        cluster_admin.form_cluster(a.nodes + b.nodes, auth, replicas=1)
        assert _identities(a.nodes + b.nodes, auth) == before  # the same node ids in the same roles
        client = connect(b.addresses, auth)
        assert client.get("{run}:head") == b"4096"
        client.close()
    with (
        LocalRedisCluster(3, data_dir=tmp_path / "a", **kept) as a,
        LocalRedisCluster(3, data_dir=tmp_path / "gone", **kept) as b,
        pytest.raises(LocalClusterError, match=r"hold a cluster from an earlier start, but .* start empty"),
    ):
        cluster_admin.form_cluster(a.nodes + b.nodes, auth, replicas=1)


def test_a_relative_data_dir_is_where_the_nodes_keep_their_files(tmp_path, monkeypatch):
    """`fleetrl train`'s default run directory is relative (runs/<task>-<time>): each node runs
    in its own folder, so the folder is made absolute first."""
    monkeypatch.chdir(tmp_path)
    with LocalRedisCluster(appendonly=True, data_dir=Path("runs/x/redis")) as cluster:
        assert cluster.data_dir == tmp_path / "runs" / "x" / "redis"
    assert sorted(p.name for p in (tmp_path / "runs" / "x" / "redis").iterdir()) == ["node0", "node1", "node2"]
