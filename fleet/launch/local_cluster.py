"""A throwaway Redis Cluster on loopback: the embedded default when no addresses are given.

    with LocalRedisCluster(num_primaries=3) as cluster:
        client = cluster.client()            # redis.cluster.RedisCluster
        client.set("{run}:head", 0)
        other_process_arg = cluster.addresses  # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"

Elsewhere, `connect(addresses)` turns that string back into a client. Over several hosts
(`fleetrl fleet up`), each host starts its own nodes with `form=False` and one of them joins
every node into one cluster with `form_cluster` (fleet/launch/cluster_admin.py, which also holds the
health checks by address).

The cluster is formed from Python (CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH, MEET) rather than
with `redis-cli --cluster create`: it needs only redis-server, it skips redis-cli's fixed
one-second settle sleeps, and every failure surfaces as a Python exception naming the node.
By default nodes are primaries only, with no persistence, in a temporary directory removed at
close: a throwaway replay buffer. `replicas=1` gives each primary a replica that takes over when
it fails; `appendonly` persists every node in an append-only file (see `_Node` for its fsync).
`data_dir` keeps the nodes in `<data_dir>/node<i>/` (appendonly, kept after close): started
again on the same folder, the nodes load their data and their nodes.conf and form the same
cluster again, on whatever ports they get this time (`meet_all`, fleet/launch/cluster_admin.py).

Under a watchdog (`supervise`), a node that exits or stops answering is restarted on its port
with its own directory and nodes.conf, so it rejoins the cluster under its node id: as the
primary of its slots again (empty unless appendonly; the run's exactly-once record held there
is lost with it), or, where its replica took over meanwhile, as the new primary's replica.
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from fleet.launch.cluster_admin import (
    NUM_SLOTS,
    LocalClusterError,
    answers,
    assign_and_meet,
    cluster_info,
    may_restart,
    meet_all,
    node_client,
    slots_assigned,
)
from fleet.launch.watchdog import Watchdog, role_spec
from foundation.config import WatchdogConfig
from foundation.process import HANDED_OUT_PORTS, parent_death_prefix, terminate
from foundation.transport import Security, connect

CLUSTER_BUS_OFFSET = 10000  # Redis fixes the cluster bus port at port + 10000.
INSTALL_HINT = "install it with `sudo apt-get update && sudo apt-get install -y redis-server`"
_PORT_ATTEMPTS = 20
_LOG_TAIL_LINES = 20


def _port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_pair(taken: set[int] | None = None, host: str = "127.0.0.1") -> int:
    """A loopback port p such that p and its cluster bus port p + 10000 are both free now.

    The OS picks p (bind to port 0); a race with another process can still take it before
    redis-server binds: LocalRedisCluster then retries with a fresh port; a launcher that named
    the ports up front (LocalFleet) fails with the node's log.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        bus = port + CLUSTER_BUS_OFFSET
        if port not in (taken or set()) | HANDED_OUT_PORTS and bus < 65536 and _port_is_free(bus, host):
            HANDED_OUT_PORTS.add(port)  # nor will this process hand it to a role
            return port
    raise LocalClusterError("found no free loopback port p with p + 10000 also free after 200 tries")


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


class _Node:
    """One redis-server child process in its own directory (`directory`, made if missing), with its log."""

    def __init__(
        self,
        binary: str,
        directory: Path,
        port: int,
        auth: Security,
        host: str,
        appendonly: bool,
        node_timeout_ms: int = 5000,
    ) -> None:
        self.host = host
        self.port = port
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "redis.log"
        self.conf = conf = self.dir / "redis.conf"
        # appendfsync no: Redis write()s the append-only file before it replies, every time, so
        # an acked write outlives any process crash, the whole fleet's included. With everysec
        # Redis postpones that write (up to 2 s) while its last fsync is still running, replies
        # meanwhile, and a SIGKILL then loses acked writes: 143 of 320 SETRANGEs in five kills under
        # a disk busy with fsyncs; none with "no". A machine that stops dead loses what the
        # kernel had not written back yet (vm.dirty_expire_centisecs, 30 s by default).
        text = (
            f"port {port}\nbind {host}\ncluster-announce-ip {host}\ndir {self.dir}\n"
            f"cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout {node_timeout_ms}\n"
            f'save ""\nappendonly {"yes" if appendonly else "no"}\nappendfsync no\ndaemonize no\n'
        )
        if auth.redis_password:
            # The run's own ACL user; the default user (no password) is switched off: no client
            # logs in as it. It keeps every permission all the same: Redis 7.0 replays an
            # append-only file's MULTI/EXEC blocks (a Lua script's writes) as the default user and
            # drops those it may not run, so a kept node would come back without them.
            name, secret = auth.redis_user, auth.redis_password
            text += f"protected-mode yes\nuser default off ~* &* +@all\nuser {name} on >{secret} ~* &* +@all\n"
            text += f"masteruser {name}\nmasterauth {secret}\n"
        else:
            text += "protected-mode no\n"
        conf.write_text(text)
        conf.chmod(0o600)  # it holds the password
        self.argv = (binary, str(conf))
        with open(self.log, "ab") as log:  # a kept directory keeps its earlier lives' logs
            self.process = subprocess.Popen(
                [*parent_death_prefix(), *self.argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
            )
        self.conn = node_client(host, port, auth)

    def wait_ping(self, deadline: float) -> bool:
        """True once our server answers with its data loaded; False if it exited (e.g. the port
        was taken) or timed out."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                # Check the pid too: a foreign server that won the port race would answer PING.
                ours = self.conn.info("server").get("process_id") == self.process.pid
                if ours and not int(self.conn.info("persistence").get("loading", 0)):
                    return True
                time.sleep(0.01)
            except redis.ConnectionError:  # BusyLoadingError (an append-only file loading) too
                time.sleep(0.01)
        return False

    def stop(self, timeout_sec: float) -> None:
        self.conn.close()
        terminate([self.process], timeout_sec)


class LocalRedisCluster:
    """`num_primaries` redis-server processes on free loopback ports, formed into one cluster.

    Start with `start()` or `with`; stop with `close()` (terminate, wait, kill), which also
    removes the temporary directory (a `data_dir` is kept). Children also get SIGTERM if this
    process dies.
    """

    def __init__(
        self,
        num_primaries: int = 3,
        *,
        startup_timeout_sec: float = 30.0,
        redis_server: str | None = None,
        auth: Security | None = None,
        host: str = "127.0.0.1",
        ports: list[int] | None = None,
        appendonly: bool = False,
        form: bool = True,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        data_dir: Path | None = None,
    ) -> None:
        """`host`: the address the nodes bind and announce (others must reach it); `ports`:
        fixed ports, one per node, primaries first (default: free ones); `appendonly`: persist
        to disk; `form` False: start the nodes only (this host's share of a cluster over several
        hosts); `replicas`: replicas per primary (a replica takes over when its primary fails,
        after `node_timeout_ms`); `data_dir`: keep the nodes there, persisted (appendonly), and
        start the cluster they hold (unformed: `form_cluster` meets them again over the hosts)."""
        total = num_primaries * (1 + replicas)
        if data_dir is not None and not appendonly:
            raise ValueError(f"data_dir ({data_dir}) keeps nodes with appendonly: without it nothing survives")
        if replicas < 0 or (replicas and not form):
            raise ValueError(f"replicas ({replicas}) must be >= 0, and only for a cluster formed here")
        if ports is not None and len(ports) != total:
            raise ValueError(f"ports ({ports}) must name one port per node ({total}: primaries, then replicas)")
        self.form, self.replicas, self.node_timeout_ms = form, replicas, node_timeout_ms
        if num_primaries < 1 or (form and num_primaries < 3):
            raise ValueError(f"num_primaries ({num_primaries}) must be >= 3: Redis Cluster needs 3 primaries")
        self.num_primaries = num_primaries
        self.startup_timeout_sec = startup_timeout_sec
        self._binary = redis_server
        self.host, self.ports, self.appendonly = host, ports, appendonly
        self.data_dir = None if data_dir is None else Path(data_dir).resolve()  # redis-server runs in it
        self.auth = auth or Security()  # with a redis_password: nodes require the run's ACL user
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._root: Path | None = None  # where the node directories are: data_dir or the temporary one
        self._nodes: list[_Node] = []

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every node: the primaries first, then their replicas."""
        self._check_started()
        return [(n.host, n.port) for n in self._nodes]

    @property
    def primaries(self) -> list[tuple[str, int]]:
        """(host, port) of the nodes started as primaries (a failover may since have moved one)."""
        return self.nodes[: self.num_primaries]

    @property
    def addresses(self) -> str:
        """The nodes as "127.0.0.1:p1,127.0.0.1:p2,..." (what `connect` and the CLI take)."""
        return ",".join(f"{h}:{p}" for h, p in self.nodes)

    @property
    def pids(self) -> list[int]:
        self._check_started()
        return [n.process.pid for n in self._nodes]

    def supervise(self, dog: Watchdog, config: WatchdogConfig, peers: list[tuple[str, int]] | None = None) -> None:
        """Hand every node to `dog` as role `redis-<port>`: restarted like any role when it exits
        or stops answering for `config.heartbeat_timeout_sec`, but a primary with a replica only
        once the replica took over (may_restart); stopped after the buffer. `peers`: every node
        of the cluster (default: this object's; over several hosts, the fleet's). Once handed
        over, the watchdog owns the processes (`pids` may name ones since restarted)."""
        for node in self._nodes:
            probe = functools.partial(answers, node.host, node.port, self.auth)
            when = functools.partial(may_restart, node.host, node.port, peers or self.nodes, self.auth)
            spec = role_spec(f"redis-{node.port}", node.argv, config, probe=probe, restart_when=when)
            dog.adopt(spec, node.process)

    def client(self) -> RedisCluster:
        """A new RedisCluster client (logged in when the nodes require it); the caller closes it."""
        return connect(self.addresses, self.auth)

    def flush(self) -> None:
        """FLUSHALL on every node (tests call this between cases)."""
        self._check_started()
        for node in self._nodes[: self.num_primaries]:
            node.conn.flushall()

    def start(self) -> LocalRedisCluster:
        """Start the processes and form the cluster; on any failure everything is stopped."""
        if self._root is not None:
            raise RuntimeError("LocalRedisCluster.start() called twice")
        binary = self._binary or shutil.which("redis-server")
        if binary is None:
            raise LocalClusterError(f"redis-server is not on PATH; {INSTALL_HINT}")
        if self.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fleetrl-redis-")
            self._root = Path(self._tmp.name)
        else:
            self._root = self.data_dir
        try:
            kept = self.kept_nodes()  # before the nodes start: a node writes its nodes.conf at once
            deadline = time.monotonic() + self.startup_timeout_sec
            for index in range(self.num_primaries * (1 + self.replicas)):
                self._nodes.append(self._start_node(binary, index, deadline))
            if kept and self.form and slots_assigned([n.conn for n in self._nodes]):
                meet_all([n.conn for n in self._nodes], self.nodes)  # the cluster they hold, on today's ports
                self._wait_cluster_ok(deadline)
            elif self.form:
                self._form_cluster()
                self._wait_cluster_ok(deadline)
                self._attach_replicas(deadline)
        except BaseException:
            self.close()
            raise
        return self

    def kept_nodes(self) -> bool:
        """True when `data_dir` holds this cluster's nodes from an earlier start (each node's
        nodes.conf); False for a new one. LocalClusterError naming the folder when it holds
        another number of nodes, or only some of them."""
        if self.data_dir is None or not self.data_dir.is_dir():
            return False
        total = self.num_primaries * (1 + self.replicas)
        found = sorted(p.parent.name for p in self.data_dir.glob("node*/nodes.conf"))
        expected = [self._node_dir(i, 0).name for i in range(total)]
        if found and found != sorted(expected):
            raise LocalClusterError(
                f"{self.data_dir} holds the cluster state of nodes {found}, this cluster has {expected} "
                f"({self.num_primaries} primaries, {self.replicas} replicas each): start it as it was, "
                "or remove the folder to start with an empty buffer"
            )
        return bool(found)

    def _node_dir(self, index: int, port: int) -> Path:
        """A kept node's folder is named by its index alone: it may get another port next time."""
        if self.data_dir is not None:
            return self.data_dir / f"node{index}"
        assert self._root is not None
        return self._root / f"node{index}-{port}"

    def close(self, timeout_sec: float = 5.0) -> None:
        """Stop every node (SIGTERM, wait, SIGKILL) and remove the directory. Idempotent."""
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.stop(timeout_sec)
        if self._tmp is not None:
            self._tmp.cleanup()

    def _check_started(self) -> None:
        if not self._nodes:
            raise RuntimeError("LocalRedisCluster is not running: call start() or use `with`")

    def _start_node(self, binary: str, index: int, deadline: float) -> _Node:
        taken = {n.port for n in self._nodes}
        logs = []
        attempts = 1 if self.ports else _PORT_ATTEMPTS
        for _ in range(attempts):
            port = self.ports[index] if self.ports else free_port_pair(taken, self.host)
            directory = self._node_dir(index, port)
            node = _Node(binary, directory, port, self.auth, self.host, self.appendonly, self.node_timeout_ms)
            if node.wait_ping(deadline):
                return node
            node.stop(1.0)
            logs.append(f"--- node {index} on port {port}:\n{_log_tail(node.log)}")
            if time.monotonic() >= deadline:
                break
            taken.add(port)
        raise LocalClusterError(f"redis-server node {index} did not start:\n" + "\n".join(logs[-3:]))

    def _form_cluster(self) -> None:
        primaries = self._nodes[: self.num_primaries]
        assign_and_meet([n.conn for n in primaries], [(n.host, n.port) for n in primaries])
        for node in self._nodes[self.num_primaries :]:  # replicas join empty, then follow a primary
            primaries[0].conn.execute_command("CLUSTER", "MEET", node.host, node.port)

    def _attach_replicas(self, deadline: float) -> None:
        """Replica i follows primary i mod num_primaries; returns once every link is up."""
        replicas = self._nodes[self.num_primaries :]
        for i, node in enumerate(replicas):
            primary = self._nodes[i % self.num_primaries]
            node_id = primary.conn.execute_command("CLUSTER", "MYID")
            node.conn.execute_command(
                "CLUSTER", "REPLICATE", node_id.decode() if isinstance(node_id, bytes) else node_id
            )
        while time.monotonic() < deadline:
            if all(node.conn.info("replication").get("master_link_status") == "up" for node in replicas):
                return
            time.sleep(0.05)
        raise LocalClusterError(f"replicas not linked to their primaries after {self.startup_timeout_sec}s")

    def _wait_cluster_ok(self, deadline: float) -> None:
        last: dict[int, str] = {}
        while time.monotonic() < deadline:
            if all(self._node_ready(node, last) for node in self._nodes):
                return
            time.sleep(0.05)
        logs = "\n".join(
            f"--- node on port {n.port} ({last.get(n.port, 'no info')}):\n{_log_tail(n.log)}" for n in self._nodes
        )
        raise LocalClusterError(
            f"cluster of {self.num_primaries} nodes not ok after {self.startup_timeout_sec}s:\n{logs}"
        )

    def _node_ready(self, node: _Node, last: dict[int, str]) -> bool:
        fields = cluster_info(node.conn)
        last[node.port] = (
            f"state={fields.get('cluster_state')} slots_ok={fields.get('cluster_slots_ok')} "
            f"known_nodes={fields.get('cluster_known_nodes')}"
        )
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_slots_ok") == str(NUM_SLOTS)
            and fields.get("cluster_known_nodes") == str(len(self._nodes))
        )
