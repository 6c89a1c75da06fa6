"""A fleet spec as one Slurm job: one node per spec host, one task per node.

    fleetrl fleet slurm fleet.yaml                 # writes <run_dir>/fleet.sbatch; prints it
    fleetrl fleet slurm fleet.yaml --submit        # ... and submits it with sbatch
    # in the job, on every node:  srun fleetrl fleet up fleet.yaml --host auto

`--host auto` maps the Slurm task onto the spec: task i (SLURM_PROCID) is the spec's i-th host,
and runs on the job's i-th node (one task per node, so SLURM_NODEID == SLURM_PROCID). Every
host's address becomes the address Slurm reaches its node at (NodeAddr, from `scontrol show
node`); the spec's own addresses are not used. A host's `cpus` are positions in the CPUs Slurm
gave its task (os.sched_getaffinity: `cpus: [0, 1]` are the first two of them); a host without
`cpus` runs on all of them. Stopping: docs/fleet-spec.md (the aggregator's host decides;
`scancel` sends SIGTERM to every process of the job, and every role stops cleanly). Preemption:
Slurm's warning (`slurm.warning_sec` before the end) stops the fleet the same way, the job
requeues itself (`slurm.requeue`), and the requeued job's hosts continue the run.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from fleet.launch.spec_model import FleetSpec, HostSpec, Workers
from foundation.config import ConfigError

SCONTROL_TIMEOUT_SEC = 30.0


class SlurmTask(NamedTuple):
    """Where this process sits in its job step (Slurm's environment variables)."""

    job_id: str
    proc_id: int  # SLURM_PROCID: this task's rank in the step
    node_id: int  # SLURM_NODEID: this task's node, relative to the job's node list
    ntasks: int  # SLURM_NTASKS (SLURM_STEP_NUM_TASKS)
    nodelist: str  # SLURM_JOB_NODELIST, e.g. "n[1-2]"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SlurmTask:
        env = os.environ if environ is None else environ
        names = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_JOB_NODELIST")
        missing = [n for n in names if n not in env]
        if missing:
            raise ConfigError(
                f"--host auto: {', '.join(missing)} not set: it works inside a Slurm job step "
                "(`srun fleetrl fleet up SPEC --host auto`, as `fleetrl fleet slurm` writes it); "
                "elsewhere name the host",
                field="--host",
            )
        return cls(
            env["SLURM_JOB_ID"], int(env["SLURM_PROCID"]), int(env["SLURM_NODEID"]), int(env["SLURM_NTASKS"]),
            env["SLURM_JOB_NODELIST"],
        )  # fmt: skip


class Placement(NamedTuple):
    spec: FleetSpec  # with every host's address its node's, and this host's CPUs Slurm's
    host: str  # this task's host in the spec


def place(spec: FleetSpec, task: SlurmTask, node_addresses: Sequence[str], allowed_cpus: set[int]) -> Placement:
    """The spec as this job runs it: host i on node i at `node_addresses[i]`; this task's host's
    `cpus` turned from positions in `allowed_cpus` (sorted) into CPU numbers."""
    hosts = spec.hosts
    if task.ntasks != len(hosts) or len(node_addresses) != len(hosts):
        raise ConfigError(
            f"the job has {task.ntasks} tasks on {len(node_addresses)} nodes ({task.nodelist}) but the spec "
            f"{len(hosts)} hosts: run one task per host on as many nodes (sbatch --nodes={len(hosts)} "
            f"--ntasks-per-node=1, as `fleetrl fleet slurm` writes)",
            field="hosts",
        )
    if task.node_id != task.proc_id:
        raise ConfigError(
            f"task {task.proc_id} runs on node {task.node_id} of {task.nodelist}: with one task per node "
            "task i must run on node i (srun --ntasks-per-node=1, block distribution)",
            field="hosts",
        )
    mine = hosts[task.proc_id]
    placed = []
    for host, address in zip(hosts, node_addresses, strict=True):
        workers = _pin(host, sorted(allowed_cpus)) if host is mine else host.workers
        placed.append(dataclasses.replace(host, address=address, workers=workers))
    return Placement(dataclasses.replace(spec, hosts=tuple(placed)), mine.name)


def _pin(host: HostSpec, allowed: list[int]) -> dict[str, Workers]:
    pinned = {}
    for role, workers in host.workers.items():
        for position in workers.cpus:
            if position >= len(allowed):
                raise ConfigError(
                    f"hosts.{host.name}.{role}.cpus: position {position} must be < {len(allowed)}, the CPUs "
                    f"Slurm gave this task ({allowed}): under Slurm `cpus` count within the task's CPUs; "
                    "ask for more with fleetrl fleet slurm --cpus-per-task",
                    field=f"hosts.{host.name}.{role}.cpus",
                )
        pinned[role] = Workers(workers.count, tuple(allowed[p] for p in workers.cpus))
    return pinned


def parse_node_addresses(text: str) -> dict[str, str]:
    """{NodeName: NodeAddr} from `scontrol show node -o` (one node per line)."""
    found = {}
    for line in text.splitlines():
        name, addr = re.search(r"\bNodeName=(\S+)", line), re.search(r"\bNodeAddr=(\S+)", line)
        if name and addr:
            found[name.group(1)] = addr.group(1)
    return found


def node_addresses(nodelist: str) -> list[str]:
    """The address of every node of `nodelist`, in the job's node order (scontrol)."""
    names = _scontrol("show", "hostnames", nodelist).split()
    addresses = parse_node_addresses(_scontrol("show", "node", "-o", ",".join(names)))
    missing = [n for n in names if n not in addresses]
    if missing:
        raise ConfigError(f"scontrol show node gave no NodeAddr for {missing}", field="--host")
    return [addresses[n] for n in names]


def place_from_env(spec: FleetSpec) -> Placement:
    """`fleet up --host auto`: this task's host, and the spec with the job's node addresses."""
    task = SlurmTask.from_env()
    return place(spec, task, node_addresses(task.nodelist), os.sched_getaffinity(0))


def _scontrol(*args: str) -> str:
    try:
        done = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, check=True, timeout=SCONTROL_TIMEOUT_SEC
        )
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or err
        raise ConfigError(f"scontrol {' '.join(args)} failed: {detail}", field="--host") from err
    return done.stdout


@dataclass(frozen=True)
class SbatchOptions:
    """What `fleetrl fleet slurm` puts in the script besides the spec."""

    cpus_per_task: int = 0  # 0: the most any host needs (cpus_needed)
    time_min: int = 0  # sbatch --time in minutes; 0: max_wall_sec plus 10 minutes
    partition: str = ""  # sbatch --partition; "": the cluster's default
    extra: tuple[str, ...] = ()  # more #SBATCH lines, e.g. "--account=lab"
    host_args: tuple[str, ...] = ()  # more `fleet up` arguments for every host: --set, --task, --config
    workdir: str = ""  # the job's working directory (--chdir); "": where `fleet slurm` runs (the submit directory)


def cpus_needed(host: HostSpec) -> int:
    """One CPU per service and worker process of the host (Redis nodes ride along), and at
    least enough for its highest `cpus` position."""
    processes = len(host.services) + sum(w.count for w in host.workers.values())
    positions = [p + 1 for w in host.workers.values() for p in w.cpus]
    return max(1, processes, *positions)


def sbatch_script(spec: FleetSpec, spec_path: pathlib.Path, max_wall_sec: float, options: SbatchOptions) -> str:
    """The batch script: one node and one task per spec host; every task runs `fleet up --host
    auto` from this Python (the same path on every node: a shared filesystem, or the same set-up).
    The batch shell stays in charge of the step: it turns Slurm's warning into a clean stop and a
    requeue (`slurm` in the spec; `_supervised`)."""
    nodes = len(spec.hosts)
    cpus = options.cpus_per_task or max(cpus_needed(h) for h in spec.hosts)
    minutes = options.time_min or int(max_wall_sec // 60) + 10
    warning = _warning_sec(spec, minutes)
    # Every path absolute, and the job in the directory a relative run_dir is relative to: every
    # node's `fleet up` then writes where --output and this script's mkdir point.
    workdir = pathlib.Path(options.workdir or pathlib.Path.cwd()).resolve()
    run_dir = workdir / spec.run_dir
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=fleetrl-{spec.run_id}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --time={minutes}",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",  # a requeued job adds to its output, under the same job id
        *(["#SBATCH --requeue"] if spec.slurm.requeue else ["#SBATCH --no-requeue"]),
        *([f"#SBATCH --signal=B:USR1@{warning}"] if warning else []),
        *([f"#SBATCH --partition={options.partition}"] if options.partition else []),
        *(f"#SBATCH {arg}" for arg in options.extra),
        "# Written by `fleetrl fleet slurm` (fleet/launch/slurm.py). Task i is the spec's i-th host:",
        f"# run directory: {run_dir}",
        *(f"#   task {i}: {h.name}" for i, h in enumerate(spec.hosts)),
        "# The tasks inherit the submitting shell's FLEETRL_TOKEN and FLEETRL_REDIS_PASSWORD (sbatch --export=ALL).",
        "# scancel sends SIGTERM to every process: each role stops cleanly, the aggregator writes its last",
        "# checkpoint and its host writes summary.json (docs/fleet-spec.md). Slurm's warning (SIGUSR1 to this",
        "# shell, slurm.warning_sec before the end) stops the fleet the same way; the job then requeues itself",
        "# (slurm.requeue) and the requeued job's hosts continue the run in the same run directory.",
        "set -uo pipefail",
        f"mkdir -p {shlex.quote(str(run_dir))}",
    ]
    fleet_up = [sys.executable, "-m", "fleet.cli.main", "fleet", "up", str(spec_path.resolve()), "--host", "auto"]
    fleet_up += options.host_args
    srun = ["srun", f"--ntasks={nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1"]
    lines += _supervised(shlex.join([*srun, "--label", *fleet_up]), run_dir, spec.slurm.requeue)
    return "\n".join(lines) + "\n"


def _warning_sec(spec: FleetSpec, minutes: int) -> int:
    """The spec's slurm.warning_sec, checked against the job's time limit."""
    warning = spec.slurm.warning_sec
    if warning >= minutes * 60:
        raise ConfigError(
            f"slurm.warning_sec ({warning}) must be below the job's time limit ({minutes * 60} s, --time {minutes}): "
            "Slurm would warn the fleet as it starts",
            field="slurm.warning_sec",
        )
    return warning


def _supervised(step: str, run_dir: pathlib.Path, requeue: bool) -> list[str]:
    """The script's body: `step` (the srun of every host) in the background, this shell waiting
    for it. On SIGUSR1 (Slurm's warning, `--signal=B:`, which reaches this shell only) every
    process of the step gets SIGTERM, on which the fleet checkpoints and stops (a SIGTERM to srun
    itself would kill the step); once the step is done the job requeues itself, and the requeued
    job's `fleet up` continues the run (the aggregator's checkpoints, the Redis data, lives.jsonl).
    Each event is a line `fleetrl-job <unix time> <event>` in the job's output."""
    lives = shlex.quote(str(run_dir / "lives.jsonl"))
    again = ['  job_event "requeued: the job goes back in the queue and resumes the run"',
             '  scontrol requeue "$SLURM_JOB_ID" || job_event "requeue refused: the run stays stopped"']  # fmt: skip
    return [
        'job_event() { echo "fleetrl-job $(date +%s.%N) $*"; }',
        f"if [ -e {lives} ]; then",
        '  job_event "resumed: job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}: continues the run in" '
        + shlex.quote(str(run_dir)),
        "else",
        '  job_event "started: job $SLURM_JOB_ID"',
        "fi",
        "warned=0",
        'warn() { warned=1; job_event "warned: SIGUSR1, the fleet checkpoints and stops"; '
        'scancel --signal=TERM "$SLURM_JOB_ID"; }',
        "trap warn USR1",
        f"{step} &",
        "fleet=$!",
        'wait "$fleet"; status=$?',
        'while kill -0 "$fleet" 2>/dev/null; do wait "$fleet"; status=$?; done  # a signal ends a wait early',
        'job_event "fleet stopped: status $status"',
        *(['if [ "$warned" = 1 ]; then', *again, "fi"] if requeue else []),
        'exit "$status"',
    ]


def submit(script: pathlib.Path, env: Mapping[str, str]) -> str:
    """sbatch the script; the job id."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True, env=dict(env), timeout=60
        )
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or err
        raise ConfigError(f"sbatch {script} failed: {detail}", field="--submit") from err
    return done.stdout.strip().split(";")[0]
