"""A fleet spec as a real Slurm job: Debian's munge, slurmctld and slurmd, started here.

    slurmctld   on a bridge at 10.231.N.254, the test's own ports, state and config
    slurmd n1   in its own network namespace (10.231.N.1), hostname and /etc/hosts
    slurmd n2   likewise at 10.231.N.2

Each node is a network namespace plus its own UTS and mount namespace (its hostname, an
/etc/hosts naming every node), so srun, slurmstepd and the fleet see two hosts with two
addresses, as on a cluster. `fleetrl fleet slurm spec --submit` runs the spec's two hosts
(Redis, buffer, aggregator, evaluator | sampler, learner) as one job of two tasks. The test
checks that the fleet learns FetchReach, stops by itself (the aggregator's host decides: at the
target, or on a loaded machine at the 240 s cap; both hosts wind down, the job completes) and
leaves summary.json; that `scancel` of
a running job leaves a last checkpoint (marked a clean shutdown) and a summary; that the spec's
`cpus` are positions in the task's Slurm CPUs; and that no process of either job is left.

Needs root, iproute2, util-linux (nsenter, unshare) and `apt-get install slurmctld slurmd
munge` (scripts/setup.sh installs them when it can); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
import yaml

from fleet.chaos.netns import unavailable as namespaces_unavailable
from foundation.checkpoint import latest_checkpoint, load_checkpoint
from foundation.process import free_port
from tests.conftest import wait_until
from tests.test_e2e_multihost import Network, _last_version

pytestmark = pytest.mark.e2e

NODES = ("n1", "n2")
FLEETRL = [sys.executable, "-m", "fleet.cli.main"]
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "nsenter", "unshare")


def _why_not() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge util-linux)"
    if (os.cpu_count() or 1) < 2:
        return "the nodes get 2 CPUs each; this machine has 1"
    return namespaces_unavailable()


class Slurm:
    """munged, slurmctld and one slurmd per node namespace, with their own config and ports."""

    def __init__(self, root: pathlib.Path, net: Network, cred_expire_sec: int = 120) -> None:
        """`cred_expire_sec`: also how long a requeued job waits before it may start again."""
        self.root, self.net, self.cred_expire_sec = root, net, cred_expire_sec
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> Slurm:
        root, bridge = self.root, f"{self.net.subnet}.254"
        for folder in ("state", "spool"):
            (root / folder).mkdir()
        (root / "munge").mkdir(mode=0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge" / "munge.sock"
        self._spawn("munged", ["munged", "-F", "-f", f"--socket={socket_path}", f"--key-file={key}",
                               f"--pid-file={root}/munge/pid", f"--log-file={root}/munge/log",
                               f"--seed-file={root}/munge/seed"])  # fmt: skip
        wait_until(socket_path.exists, 30, "munged's socket", self.procs)
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.net.addresses[n]} CPUs=2 State=UNKNOWN" for n in NODES
        )  # fmt: skip
        (root / "slurm.conf").write_text(
            f"ClusterName=fleetrl\nSlurmctldHost={socket.gethostname()}({bridge})\n"
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={socket_path},cred_expire={self.cred_expire_sec}\n"
            f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool/%n\nSlurmctldPidFile={root}/ctld.pid\n"
            f"SlurmdPidFile={root}/slurmd-%n.pid\nSlurmctldLogFile={root}/slurmctld.log\n"
            f"SlurmdLogFile={root}/slurmd-%n.log\n"
            # No cgroups: a node namespace has none of its own. linuxproc still finds every
            # descendant of a task (scancel signals them all); task/affinity binds CPUs.
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\nSlurmdParameters=config_overrides\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nMpiDefault=none\nReturnToService=2\nKillWait=30\n"
            f"{nodes}\nPartitionName=fleet Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP\n"
        )
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(root / "slurm.conf")])
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.net.addresses[n]} {n}\n" for n in NODES)
        (root / "hosts").write_text(hosts + f"{bridge} {socket.gethostname()}\n")
        for node in NODES:
            inside = f"mount --bind {root}/hosts /etc/hosts && hostname {node} && exec slurmd -D -f {root}/slurm.conf"
            netns = f"--net=/run/netns/{self.net.namespaces[node]}"
            self._spawn(f"slurmd-{node}", ["nsenter", netns, "unshare", "--uts", "--mount", "sh", "-c", inside])
        try:
            wait_until(lambda: self.sinfo() == ["idle", "idle"], 60, "two idle nodes", self.procs)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.logs()}") from err
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, *argv: str, check: bool = True, cwd: pathlib.Path | None = None) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, cwd=cwd)
        assert not check or done.returncode == 0, f"{argv}: {done.stderr}"
        return done.stdout

    def sinfo(self) -> list[str]:
        return sorted(self.run("sinfo", "-h", "-N", "-o", "%T", check=False).split())

    def job_state(self, job: str) -> str:
        found = re.search(r"JobState=(\S+)", self.run("scontrol", "show", "job", job, check=False))
        return found.group(1) if found else "gone"

    def logs(self) -> str:
        paths = sorted([*self.root.glob("*.log"), *self.root.glob("*.out")])
        return "".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in paths)

    def close(self) -> None:
        subprocess.run(["scancel", "--full", "--partition=fleet"], env=self.env, capture_output=True, timeout=30)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


@contextlib.contextmanager
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory, tag: int, cred_expire_sec: int = 120) -> Iterator[Slurm]:
    """A started Slurm of two nodes on a network of its own (`tag` picks it: one per test module),
    or the test skipped with the reason."""
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    os.chmod(root, 0o755)  # munged refuses a socket in a directory others cannot reach
    with Network(f"{(os.getpid() + tag) % 4096:03x}", NODES) as net:
        cluster = Slurm(root, net, cred_expire_sec)
        try:
            yield cluster.start()
        finally:
            cluster.close()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    with slurm_cluster(tmp_path_factory, 2048) as cluster:
        yield cluster


def _submit(slurm: Slurm, tmp_path: pathlib.Path, config: dict) -> tuple[str, pathlib.Path]:
    """Submit the spec's job from a directory of its own, as a user in their project folder would,
    with the spec elsewhere and a relative run_dir: the run lands under the submit directory."""
    submit_dir = tmp_path / "submitted-from"
    submit_dir.mkdir()
    run_dir = submit_dir / "run"
    spec = {
        "run_id": tmp_path.name[:20].replace("[", "").replace("]", ""),
        "run_dir": "run",
        "config": {"sim.task": "FetchReach-v4", "learner.min_replay_transitions": 500, **config},
        "hosts": {  # the addresses are Slurm's: each host's node's NodeAddr
            "services": {"address": "services", "redis": [7000, 7001, 7002], "buffer": 50051, "aggregator": 50052,
                         "evaluator": 1},
            "workers": {"address": "workers", "sampler": {"count": 1, "cpus": [1]}, "learner": 1},
        },
    }  # fmt: skip
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(spec))
    out = slurm.run(sys.executable, "-m", "fleet.cli.main", "fleet", "slurm", str(tmp_path / "fleet.yaml"),
                    "--cpus-per-task", "2", "--submit", cwd=submit_dir)  # fmt: skip
    job = re.search(r"submitted job (\d+)", out)
    assert job, out
    print(f"\nsubmitted job {job.group(1)}")
    return job.group(1), run_dir


def _job_log(run_dir: pathlib.Path, job: str) -> str:
    path = run_dir / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else "(no job output yet)"


def _fleet_processes(under: pathlib.Path) -> list[psutil.Process]:
    """Every process whose command line names a path under `under` (the spec, the run directory),
    or that runs in a directory under it (the job's roles name the relative run_dir from there)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        named = any(str(under) in part for part in proc.info["cmdline"] or ())
        if named or str(proc.info.get("cwd") or "").startswith(f"{under}/"):
            found.append(proc)
    return found


def _wait_job_gone(slurm: Slurm, job: str, run_dir: pathlib.Path, timeout_sec: float) -> str:
    """The job's final state, once Slurm says it ended and none of its processes is left."""
    ended = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "gone")
    log = lambda: f"job {job} to end:\n" + _job_log(run_dir, job)  # noqa: E731
    wait_until(lambda: slurm.job_state(job) in ended, timeout_sec, log)
    root = run_dir.parent.parent  # the test's folder: the spec beside the submit directory
    left = lambda: [p.info["cmdline"] for p in _fleet_processes(root)]  # noqa: E731
    wait_until(lambda: not left(), 30, lambda: f"job {job}'s processes to exit: {left()}")
    return slurm.job_state(job)


def test_a_slurm_job_learns_fetchreach_stops_by_itself_and_pins_to_its_cpus(
    slurm: Slurm, tmp_path: pathlib.Path
) -> None:
    started = time.monotonic()
    job, run_dir = _submit(slurm, tmp_path, {"max_wall_sec": 240})

    def sampler() -> psutil.Process | None:
        return next((p for p in _fleet_processes(tmp_path) if "sampler" in p.info["cmdline"]), None)

    pinned = wait_until(sampler, 60, lambda: "the sampler to start:\n" + _job_log(run_dir, job))
    fleet_up = pinned.parent()  # the workers host's `fleet up --host auto`, which the task started as
    assert fleet_up is not None and fleet_up.cmdline()[:5] == [*FLEETRL, "fleet", "up"], fleet_up
    task_cpus = sorted(fleet_up.cpu_affinity())  # what Slurm gave the task (task/affinity)
    assert pinned.cpu_affinity() == [task_cpus[1]], (task_cpus, pinned.info["cmdline"])  # cpus: [1] is a position
    state = _wait_job_gone(slurm, job, run_dir, 360)
    log = _job_log(run_dir, job)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"job {job}: {state} after {time.monotonic() - started:.0f}s; {summary['stop_reason']}; "
          f"{summary['final_env_steps']} env steps, version {summary['final_version']}")  # fmt: skip
    assert state == "COMPLETED", log
    # It learned: the target on a complete 50-episode score (the stop), or, where a loaded machine
    # ran it into the cap first, 90% on the final 50 held-out episodes of its last checkpoint.
    learned = summary["reached_target"] or (summary["final_success"] or 0.0) >= 0.9
    assert learned, (summary["stop_reason"], summary["final_success"], log[-3000:])
    decided = "evaluation success" if summary["reached_target"] else "max_wall_sec 240.0 reached"
    assert summary["stop_reason"].startswith(decided), summary["stop_reason"]
    assert load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["clean_shutdown"], summary["checkpoints"]
    assert f"services: winding down: {decided}" in log, log[-3000:]
    assert f"workers: winding down: {decided}" in log, log[-3000:]  # the other host followed the board
    assert (run_dir / "workers" / "logs" / "sampler-0.log").exists()  # each host's logs under its name


def test_scancel_of_a_running_fleet_leaves_a_last_checkpoint_and_a_summary(
    slurm: Slurm, tmp_path: pathlib.Path
) -> None:
    job, run_dir = _submit(slurm, tmp_path, {"max_wall_sec": 300})
    trained = lambda: "a score of a trained version:\n" + _job_log(run_dir, job)  # noqa: E731
    wait_until(lambda: _last_version(run_dir) > 0, 180, trained)
    slurm.run("scancel", job)  # learning has begun, the target is far
    state = _wait_job_gone(slurm, job, run_dir, 60)
    summary_path = run_dir / "summary.json"
    assert summary_path.exists(), _job_log(run_dir, job)[-3000:]
    summary = json.loads(summary_path.read_text())
    last = latest_checkpoint(run_dir / "checkpoints")
    assert last is not None, _job_log(run_dir, job)[-3000:]
    print(f"\njob {job}: {state}; {summary['stop_reason']}; last checkpoint {last.name}")
    assert state == "CANCELLED"
    assert summary["stop_reason"] == "interrupted (Ctrl-C or SIGTERM)"
    last_state = load_checkpoint(last)
    assert last_state["clean_shutdown"], "the aggregator wrote no checkpoint on its way out"
    assert int(last_state["version"]) > 0, last.name
    assert last in {run_dir.parent / path for path in summary["checkpoints"]}  # relative to the job's directory
