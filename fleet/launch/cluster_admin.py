"""A Redis Cluster's nodes by address, on any host: do they answer, is the cluster formed, may a
dead node start again, and forming running nodes into one cluster.

    form_cluster(nodes, auth, replicas=1)          # nodes: [(host, port), ...], primaries first
    cluster_ok(nodes, auth)                        # True once every node reports one formed cluster
    may_restart(host, port, nodes, auth)           # the watchdog's gate for a dead node

`LocalRedisCluster` (fleet/launch/local_cluster.py) starts nodes on this host and forms them with the
same calls; `fleetrl fleet up` and `fleetrl redis-cluster --join` form nodes started elsewhere.
"""

from __future__ import annotations

import time

import redis

from foundation.errors import RunFailed
from foundation.transport import Security

NUM_SLOTS = 16384


class LocalClusterError(RunFailed, RuntimeError):
    """The local cluster could not be started or formed; the message carries the node logs."""


def node_client(host: str, port: int, auth: Security, timeout_sec: float = 5.0) -> redis.Redis:
    """A client of one node (not the cluster), logged in as the run's user when it has a password."""
    user: str | None = auth.redis_user if auth.redis_password else None
    password: str | None = auth.redis_password or None
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout_sec,
        socket_connect_timeout=timeout_sec,
        username=user,
        password=password,
    )


def cluster_info(conn: redis.Redis) -> dict[str, str]:
    """The node's CLUSTER INFO fields by name (cluster_state, cluster_slots_ok, ...)."""
    info = conn.execute_command("CLUSTER", "INFO")
    if isinstance(info, bytes):
        info = info.decode()
    return dict(line.split(":", 1) for line in str(info).split() if ":" in line)


def answers(host: str, port: int, auth: Security, timeout_sec: float = 0.5) -> bool:
    """True when the node answers at all within `timeout_sec` (a node still loading its
    append-only file answers with an error: alive, not hung)."""
    conn = node_client(host, port, auth, timeout_sec)
    try:
        conn.ping()
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    except redis.RedisError:
        return True
    finally:
        conn.close()
    return True


def nodes_answer(nodes: list[tuple[str, int]], auth: Security) -> bool:
    """True when every node answers PING (logged in as the run's user when it has a password)."""
    for host, port in nodes:
        conn = node_client(host, port, auth)
        try:
            conn.ping()
        except redis.RedisError:
            return False
        finally:
            conn.close()
    return True


def cluster_ok(nodes: list[tuple[str, int]], auth: Security) -> bool:
    """True when every node answers and reports one formed cluster of exactly these nodes."""
    for host, port in nodes:
        conn = node_client(host, port, auth)
        try:
            fields = cluster_info(conn)
        except redis.RedisError:
            return False
        finally:
            conn.close()
        ok = fields.get("cluster_state") == "ok" and fields.get("cluster_slots_ok") == str(NUM_SLOTS)
        if not ok or fields.get("cluster_known_nodes") != str(len(nodes)):
            return False
    return True


def may_restart(host: str, port: int, peers: list[tuple[str, int]], auth: Security) -> bool:
    """Whether a node that died may start again now. A primary restarted before its replica took
    over comes back empty (no persistence) as the primary of its slots, and the replica then
    copies the empty data set: every write acked with WAIT is lost. So a primary that still holds
    slots and has a replica waits; a replica, or a primary without one, may start at once. Asks the
    first other node that answers; True when none does."""
    for peer in peers:
        if peer == (host, port):
            continue
        conn = node_client(*peer, auth, timeout_sec=0.5)
        try:
            view = conn.execute_command("CLUSTER", "NODES")
        except redis.RedisError:
            continue
        finally:
            conn.close()
        return restart_is_safe(view.decode() if isinstance(view, bytes) else str(view), host, port)
    return True


def restart_is_safe(cluster_nodes: str, host: str, port: int) -> bool:
    """From one node's CLUSTER NODES text: False while `host:port` is a primary holding slots
    that a replica follows (its replica has not taken over yet)."""
    rows = [line.split() for line in cluster_nodes.splitlines() if line.strip()]
    me = next((r for r in rows if r[1].split("@")[0] == f"{host}:{port}"), None)
    if me is None or "master" not in me[2].split(",") or len(me) <= 8:  # unknown, a replica, or no slots
        return True
    return not any(r[3] == me[0] for r in rows)  # a replica follows it: wait for the failover


def assign_and_meet(conns: list[redis.Redis], nodes: list[tuple[str, int]]) -> None:
    """Split the slots evenly, give each node its own config epoch, then MEET them all."""
    bounds = [NUM_SLOTS * i // len(nodes) for i in range(len(nodes) + 1)]
    for i, conn in enumerate(conns):
        conn.execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
        # Distinct epochs up front spare the epoch-collision resolution round (what
        # redis-cli --cluster create does too).
        conn.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
    for host, port in nodes[1:]:
        conns[0].execute_command("CLUSTER", "MEET", host, port)


def slots_assigned(conns: list[redis.Redis]) -> bool:
    """True when any of these nodes has slots assigned in its view of the cluster: nodes that
    restarted from their nodes.conf hold a formed cluster (none: a cluster never formed)."""
    return any(int(cluster_info(conn).get("cluster_slots_assigned", 0)) for conn in conns)


def meet_all(conns: list[redis.Redis], nodes: list[tuple[str, int]]) -> None:
    """MEET every node with every other at the address it has now.

    Nodes restarted from their nodes.conf keep their ids, slots, roles and config epochs, but
    the file holds the addresses of their last start. Keeping the ports would fail whenever one
    of them has been taken since (a reboot, another run); instead each node meets the others
    where they are now: a handshake answered under a node id the node knows updates that node's
    address (Redis moves a known node, it does not add one). Every pair meets, so no node
    waits on gossip from a node that cannot reach it yet."""
    for i, conn in enumerate(conns):
        for j, (host, port) in enumerate(nodes):
            if i != j:
                conn.execute_command("CLUSTER", "MEET", host, port)


def form_cluster(nodes: list[tuple[str, int]], auth: Security, timeout_sec: float = 60.0, replicas: int = 0) -> None:
    """Join running cluster-enabled nodes (on any hosts) into one cluster. Empty nodes: split the
    slots evenly over the primaries (the first len(nodes) / (1 + replicas) nodes), give each its
    own config epoch, MEET them all, wait until every node says ok; replica i then follows
    primary i mod primaries. Nodes that hold a cluster from an earlier start (their nodes.conf and
    data kept: a restarted, requeued or rescheduled fleet) meet again where they are now, keeping
    their slots and roles; LocalClusterError naming the nodes when only some of them hold it. A
    cluster already formed from exactly these nodes is left as it is."""
    if cluster_ok(nodes, auth):
        return
    conns = [node_client(h, p, auth) for h, p in nodes]
    try:
        kept = [int(cluster_info(conn).get("cluster_slots_assigned", 0)) > 0 for conn in conns]
        if any(kept):
            _meet_kept(conns, nodes, kept, auth, timeout_sec)
        else:
            _form_empty(conns, nodes, auth, replicas, timeout_sec)
    finally:
        for conn in conns:
            conn.close()


def _meet_kept(
    conns: list[redis.Redis], nodes: list[tuple[str, int]], kept: list[bool], auth: Security, timeout_sec: float
) -> None:
    """Nodes restarted from their nodes.conf: every one met at its address now, until ok."""
    empty = [node for node, held in zip(nodes, kept, strict=True) if not held]
    if empty:
        raise LocalClusterError(
            f"nodes {[n for n in nodes if n not in empty]} hold a cluster from an earlier start, but {empty} "
            "start empty (their data folder is gone or new): start every node on its kept folder (a host's "
            "redis_dir), or remove every folder to start with an empty buffer"
        )
    meet_all(conns, nodes)
    deadline = time.monotonic() + timeout_sec
    while not cluster_ok(nodes, auth):
        if time.monotonic() > deadline:
            raise LocalClusterError(f"the kept cluster of {len(nodes)} nodes ({nodes}) not ok after {timeout_sec}s")
        time.sleep(0.05)


def _form_empty(
    conns: list[redis.Redis], nodes: list[tuple[str, int]], auth: Security, replicas: int, timeout_sec: float
) -> None:
    count = len(nodes) // (1 + replicas)
    deadline = time.monotonic() + timeout_sec
    assign_and_meet(conns[:count], nodes[:count])
    for host, port in nodes[count:]:  # replicas join empty, then follow a primary
        conns[0].execute_command("CLUSTER", "MEET", host, port)
    while not cluster_ok(nodes, auth):
        if time.monotonic() > deadline:
            raise LocalClusterError(f"cluster of {len(nodes)} nodes ({nodes}) not ok after {timeout_sec}s")
        time.sleep(0.05)
    for i, conn in enumerate(conns[count:]):
        node_id = conns[i % count].execute_command("CLUSTER", "MYID")
        conn.execute_command("CLUSTER", "REPLICATE", node_id.decode() if isinstance(node_id, bytes) else node_id)
    while not all(c.info("replication").get("master_link_status") == "up" for c in conns[count:]):
        if time.monotonic() > deadline:
            raise LocalClusterError(f"replicas {nodes[count:]} not linked to their primaries after {timeout_sec}s")
        time.sleep(0.05)
