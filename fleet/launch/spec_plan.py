"""What a fleet spec will start, as `fleetrl fleet check fleet.yaml` prints it.

    print("\\n".join(plan_lines(spec, spec.config())))

Each host's roles (worker ids and CPU pins), the ports the hosts must open to one another,
the Redis Cluster's primaries and replicas, and the settings derived from the spec.
"""

from __future__ import annotations

from fleet.launch.spec_checks import REDIS_BUS_OFFSET, open_ports, redis_layout
from fleet.launch.spec_model import SERVICES, FleetSpec, HostSpec
from foundation.config import RunConfig


def plan_lines(spec: FleetSpec, config: RunConfig) -> list[str]:
    """Every line of `fleetrl fleet check`'s plan."""
    width = max(len(h.name) for h in spec.hosts)
    lines = [f"run {spec.run_id}: {len(spec.hosts)} hosts, run_dir {spec.run_dir} on every host", "hosts:"]
    lines += [f"  {h.name:<{width}}  {h.address:<15}  {_roles(spec, h)}" for h in spec.hosts]
    lines += ["ports to open (TCP, from every other host of the fleet):"]
    by_address: dict[str, list[str]] = {}
    for port in open_ports(spec):
        by_address.setdefault(port.address, []).append(f"{port.port} {port.what}")
    lines += [f"  {address:<15}  " + ", ".join(ports) for address, ports in by_address.items()]
    lines.append(
        "  (each role's Prometheus metrics port is picked free at start and listed in "
        "<run_dir>/<host>/metrics.json: open those to your Prometheus only)"
    )
    lines += _redis(spec)
    lines += _lasting(spec, config)
    lines += _derived(spec, config)
    return lines


def _roles(spec: FleetSpec, host: HostSpec) -> str:
    parts = [f"redis {', '.join(map(str, host.redis))}"] if host.redis else []
    parts += [f"{role} :{host.services[role]}" for role in SERVICES if role in host.services]
    for role, workers in host.workers.items():
        first = spec.first_id(host, role)
        ids = f"id {first}" if workers.count == 1 else f"ids {first}-{first + workers.count - 1}"
        pin = f", cpus {','.join(map(str, workers.cpus))}" if workers.cpus else ""
        parts.append(f"{role} x{workers.count} ({ids}{pin})")
    return "; ".join(parts)


def _redis(spec: FleetSpec) -> list[str]:
    layout = redis_layout(spec)
    former = next(h.name for h in spec.hosts if h.redis)
    lines = [
        f"redis cluster: {len(spec.redis_nodes)} nodes, {len(layout.primaries)} primaries, "
        f"redis_replicas {spec.redis_replicas} (formed by {former}; cluster bus = port + {REDIS_BUS_OFFSET})"
    ]
    for (host, port), (p_host, p_port) in layout.replicas:
        same = "  <- same address as its primary: losing that host loses both" if host == p_host else ""
        lines.append(f"  replica {host}:{port} follows {p_host}:{p_port}{same}")
    return lines


def _lasting(spec: FleetSpec, config: RunConfig) -> list[str]:
    """Where the Redis data outlives the fleet, and what Slurm is asked to do at the job's end."""
    if config.buffer.durable:
        kept = ", ".join(f"{h.name} in {spec.redis_dir(h)}" for h in spec.hosts if h.redis)
        lines = [f"redis data (buffer.durable): {kept}; a restarted or requeued fleet starts from it"]
    else:
        lines = ["redis data: none kept (buffer.durable false): a restarted fleet starts with an empty buffer"]
    slurm = spec.slurm
    warning = f"SIGUSR1 {slurm.warning_sec} s before the end" if slurm.warning_sec else "no warning"
    lines.append(
        f"under slurm: {warning}, requeue {'on' if slurm.requeue else 'off'} (slurm.warning_sec, slurm.requeue)"
    )
    return lines


def stale_gradient_warning(config: RunConfig) -> str | None:
    """Why most gradients would be dropped as stale, or None: with L learners and K gradients per
    step, while one learner computes the others close about ceil(L/K) - 1 versions, so its gradient
    arrives that far behind; past learner.max_grad_staleness, the aggregator drops it. `fleet check`
    and `fleetrl train` (the local fleet) both say it before a run starts."""
    learners, k = config.learner.num_learners, config.grads_per_step()
    behind = -(-learners // k) - 1  # versions the other learners' steps add while one computes
    if behind <= config.learner.max_grad_staleness:
        return None
    return (
        f"{learners} learners at {k} gradients per step: a gradient arrives about {behind} "
        f"versions behind, more than learner.max_grad_staleness {config.learner.max_grad_staleness}, so "
        f"most are dropped as stale (a preset's two-learner K=1 settings?): set aggregator.grads_per_step=0 "
        f"(every learner) or raise learner.max_grad_staleness"
    )


def _derived(spec: FleetSpec, config: RunConfig) -> list[str]:
    agg, learners, k = config.aggregator, config.learner.num_learners, config.grads_per_step()
    why = "every learner of the spec" if not agg.grads_per_step else "set in the config"
    lines = [
        "derived settings:",
        f"  sampler.num_samplers = {config.sampler.num_samplers} (summed over the hosts)",
        f"  learner.num_learners = {learners} (summed over the hosts)",
        f"  aggregator.grads_per_step = {agg.grads_per_step} -> {k} gradients per step ({why})",
        f"  buffer.replicas_to_ack = {config.buffer.replicas_to_ack}",
    ]
    if agg.grads_per_step > learners:
        lines.append(
            f"  warning: grads_per_step {agg.grads_per_step} > {learners} learners: every step closes by "
            f"aggregator.step_deadline_ms ({agg.step_deadline_ms:g})"
        )
    stale = stale_gradient_warning(config)
    if stale:
        lines.append(f"  warning: {stale}")
    aggregator_host = next(h.name for h in spec.hosts if "aggregator" in h.services)
    lines += [
        f"stop: {aggregator_host} (the aggregator's host) stops the whole fleet at target_success "
        f"{config.target_success:g}, max_wall_sec {config.max_wall_sec:g} or max_env_steps "
        f"{config.max_env_steps or 'none'}, or on its own Ctrl-C or SIGTERM; every host winds down "
        "(docs/fleet-spec.md)",
        f"results: summary.json, checkpoints, evals.jsonl and tb/ in {spec.run_dir}/ on {aggregator_host}; "
        f"each host's logs in {spec.run_dir}/<host>/",
    ]
    return lines
