"""The fleet's wire security and gRPC plumbing, shared by every service and client.

    security = Security.from_config(config.security)     # token (file or FLEETRL_TOKEN), TLS files
    server = grpc.server(pool, options=GRPC_OPTIONS, interceptors=security.server_interceptors(counter))
    port = security.add_port(server, "0.0.0.0:50051")     # TLS when configured
    channel = security.channel("10.0.0.6:50051")          # sends the token on every call

Every RPC carries the fleet's token in its `authorization` metadata; a server with a token
refuses any call without the right one (UNAUTHENTICATED, counted) before the handler runs.
TLS (server certificate, optionally client certificates) is on when `security.tls_cert` is
set; `fleetrl certs` makes a self-signed set. The local launcher generates a token (and a
Redis password) per run, so a local run needs no set-up.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from redis.cluster import ClusterNode, RedisCluster

from foundation.config import SecurityConfig
from foundation.errors import FleetrlError

log = logging.getLogger("fleetrl.transport")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A role started before its peer (or whose peer restarted) retries the connection within
    # 2 s; gRPC's default backoff grows to 120 s, so a sampler could act without weights for minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
HEALTH_PREFIX = "/grpc.health.v1.Health/"  # probes (grpc_health_probe, orchestrators) need no token
TOKEN_ENV = "FLEETRL_TOKEN"
REDIS_PASSWORD_ENV = "FLEETRL_REDIS_PASSWORD"
_HEADER = "authorization"


def parse_hostport(address: str, field: str = "address") -> tuple[str, int]:
    """'10.0.0.5:50051' -> ('10.0.0.5', 50051); ValueError names the field and the value."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{field} ({address!r}) must look like HOST:PORT with PORT in 0..65535")
    return host, int(port)


class SecurityError(FleetrlError, ValueError):
    """A security setting cannot be used (missing file, half a TLS pair); names the field."""


def _read(path: str, field: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as err:
        raise SecurityError(f"security.{field} ({path!r}) cannot be read: {err.strerror}") from err


@dataclass(frozen=True)
class Security:
    token: str = ""  # empty: no token sent, none required
    tls_cert: bytes = b""  # PEM; with tls_key, servers serve TLS
    tls_key: bytes = b""
    tls_ca: bytes = b""  # PEM; clients verify servers against it, servers verify client certs with it
    tls_client_auth: bool = False
    redis_user: str = ""
    redis_password: str = ""

    @classmethod
    def from_config(cls, config: SecurityConfig, environ: dict[str, str] | None = None) -> Security:
        if not config.enabled:
            return cls()
        env = os.environ if environ is None else environ
        token = _read(config.token_file, "token_file").decode().strip() if config.token_file else env.get(TOKEN_ENV, "")
        password = env.get(REDIS_PASSWORD_ENV, "")
        if config.redis_password_file:
            password = _read(config.redis_password_file, "redis_password_file").decode().strip()
        if bool(config.tls_cert) != bool(config.tls_key):
            raise SecurityError("security.tls_cert and security.tls_key come together: set both or neither")
        if config.tls_client_auth and not config.tls_ca:
            raise SecurityError("security.tls_client_auth needs security.tls_ca to check client certificates")
        return cls(
            token=token,
            tls_cert=_read(config.tls_cert, "tls_cert") if config.tls_cert else b"",
            tls_key=_read(config.tls_key, "tls_key") if config.tls_key else b"",
            tls_ca=_read(config.tls_ca, "tls_ca") if config.tls_ca else b"",
            tls_client_auth=config.tls_client_auth,
            redis_user=config.redis_user if password else "",
            redis_password=password,
        )

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    # --- servers --------------------------------------------------------------------------
    def server_interceptors(self, refused: RefusalCounter | None = None) -> list[grpc.ServerInterceptor]:
        return [TokenCheck(self.token, refused)] if self.token else []

    def aio_server_interceptors(self, refused: RefusalCounter | None = None) -> list[grpc.aio.ServerInterceptor]:
        """The same check for a grpc.aio server."""
        return [AioTokenCheck(self.token, refused)] if self.token else []

    def add_port(self, server: grpc.Server | grpc.aio.Server, address: str) -> int:
        """Bind `address` (TLS when configured); returns the port, 0 if it could not bind."""
        if not self.tls:
            return server.add_insecure_port(address)
        credentials = grpc.ssl_server_credentials(
            [(self.tls_key, self.tls_cert)],
            root_certificates=self.tls_ca or None,
            require_client_auth=self.tls_client_auth,
        )
        return server.add_secure_port(address, credentials)

    # --- clients --------------------------------------------------------------------------
    def channel(self, address: str) -> grpc.Channel:
        """A channel to `address` that sends the token on every call (TLS when a CA is set)."""
        if self.tls_ca:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.tls_ca,
                private_key=self.tls_key or None if self.tls_client_auth else None,
                certificate_chain=self.tls_cert or None if self.tls_client_auth else None,
            )
            channel = grpc.secure_channel(address, credentials, options=GRPC_OPTIONS)
        else:
            channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        if not self.token:
            return channel
        return grpc.intercept_channel(channel, _TokenSender(self.token))


NO_SECURITY = Security()

UNREACHABLE_LOG_SEC = 60.0  # a peer that stays away is logged at most this often


class Backoff:
    """How every client retries a peer: exponential delays with jitter (first_sec doubling up
    to max_sec), and one log line a minute naming the peer while it stays away.

        backoff = Backoff(f"aggregator {address}")
        while True:
            try: return call()
            except grpc.RpcError as err:
                if not retryable(err) or backoff.elapsed_sec + backoff.delay > deadline: raise
                backoff.wait(err.code().name)       # sleeps; says 'unreachable for 63s' once a minute
        backoff.reset()                             # the peer answered
    """

    def __init__(self, peer: str, first_sec: float = 0.05, max_sec: float = 2.0, seed: int | None = None) -> None:
        self.peer, self.first_sec, self.max_sec = peer, first_sec, max_sec
        self._rng = random.Random(seed)
        self._logged = -UNREACHABLE_LOG_SEC
        self.reset()

    def reset(self) -> None:
        self.delay = self.first_sec
        self._since: float | None = None

    @property
    def elapsed_sec(self) -> float:
        """Seconds since the first failure of this streak (0 before any)."""
        return 0.0 if self._since is None else time.monotonic() - self._since

    def wait(self, why: str, detail: str = "") -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._logged >= UNREACHABLE_LOG_SEC:
            self._logged = now
            log.warning("%s unreachable for %.0fs (%s)%s", self.peer, now - self._since, why, detail)
        time.sleep(self.delay * self._rng.uniform(0.5, 1.0))
        self.delay = min(2 * self.delay, self.max_sec)


class RefusalCounter:
    """Calls refused for a missing or wrong token, per method (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_method: dict[str, int] = {}

    def add(self, method: str) -> None:
        with self._lock:
            self.by_method[method] = self.by_method.get(method, 0) + 1

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.by_method.values())


class TokenCheck(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call whose `authorization` is not `Bearer <token>`."""

    def __init__(self, token: str, refused: RefusalCounter | None = None) -> None:
        self._expected = f"Bearer {token}".encode()
        self.refused = refused or RefusalCounter()

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        why = self.refusal(handler, details)
        if why is None:
            return handler

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        return _same_kind(handler, refuse)

    def refusal(self, handler: Any, details: Any) -> str | None:
        """Why this call is refused (counted), or None to let it through."""
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return None
        given = dict(details.invocation_metadata or ()).get(_HEADER, "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given_bytes, self._expected):
            return None
        self.refused.add(details.method)
        return f"authorization: {'missing' if not given else 'wrong'} fleet token (see security.token_file)"


class AioTokenCheck(grpc.aio.ServerInterceptor):
    """TokenCheck for a grpc.aio server."""

    def __init__(self, token: str, refused: RefusalCounter | None = None) -> None:
        self._check = TokenCheck(token, refused)

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        why = self._check.refusal(handler, details)
        if why is None:
            return handler

        async def refuse(request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        return _same_kind(handler, refuse)


def _same_kind(handler: Any, behavior: Callable[..., Any]) -> Any:
    """A method handler of `handler`'s kind (unary/stream in and out) running `behavior`."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class _TokenSender(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._header = (_HEADER, f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


def serving(channel: grpc.Channel, service: str = "", timeout_sec: float = 1.0) -> bool:
    """True when the server behind `channel` answers the standard health check with SERVING
    (for `service`, or the whole server); False while it is not up or not serving."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_sec
        )
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class StandardServices:
    """grpc.health.v1 health checking and server reflection on a fleetrl server.

        services = StandardServices(server, ["fleetrl.v1.Aggregator"])   # before server.start()
        services.set_serving(ok)      # e.g. False while the service's own Redis does not answer

    `grpc_health_probe -addr HOST:PORT` and `grpcurl -plaintext HOST:PORT list` then work, and
    orchestrators can probe readiness. Health calls need no token; reflection does. For a
    grpc.aio server pass its event loop (`loop`); set_serving may then be called from any
    other thread, and `await set_serving_async(ok)` from the loop itself.
    """

    def __init__(self, server: Any, service_names: list[str], loop: asyncio.AbstractEventLoop | None = None) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        self._pb = health_pb2
        self._loop = loop
        self._health: Any = health.aio.HealthServicer() if loop is not None else health.HealthServicer()
        self.names = list(service_names)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            server,
        )
        self.serving: bool | None = None
        if loop is None:
            self.set_serving(True)

    def set_serving(self, ok: bool) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.set_serving_async(ok), self._loop).result(10)
            return
        if ok == self.serving:
            return
        self.serving = ok
        for name in ["", *self.names]:
            self._health.set(name, self._status(ok))

    async def set_serving_async(self, ok: bool) -> None:
        if ok == self.serving:
            return
        self.serving = ok
        for name in ["", *self.names]:
            await self._health.set(name, self._status(ok))

    def _status(self, ok: bool) -> int:
        return self._pb.HealthCheckResponse.SERVING if ok else self._pb.HealthCheckResponse.NOT_SERVING


def connect(addresses: str, security: Security | None = None) -> RedisCluster:
    """A RedisCluster client for "host:port,host:port" (any reachable subset of the nodes),
    logged in as the run's ACL user when `security` carries a Redis password."""
    nodes = [ClusterNode(h, p) for h, p in parse_addresses(addresses)]
    if security is None or not security.redis_password:
        return RedisCluster(startup_nodes=nodes)
    return RedisCluster(startup_nodes=nodes, username=security.redis_user, password=security.redis_password)


def parse_addresses(addresses: str) -> list[tuple[str, int]]:
    """Parse "host:port,host:port" into [(host, port), ...]; ValueError names the bad item."""
    items = [a.strip() for a in addresses.split(",") if a.strip()]
    if not items:
        raise ValueError(f"redis addresses {addresses!r} is empty: expected 'host:port,host:port'")
    out = []
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"redis address {item!r} in {addresses!r} must look like host:port with port in 1..65535")
        out.append((host, int(port)))
    return out
