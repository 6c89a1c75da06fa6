"""`fleetrl fleet slurm` and `fleet up --host auto` without Slurm: the batch script, the mapping
of tasks onto hosts and of `cpus` onto the task's CPUs, and the stop board on a real Redis Cluster.
The same run under a real slurmctld and slurmd: tests/test_slurm.py."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal
import subprocess

import pytest
import yaml

from fleet.cli.main import main
from fleet.launch.slurm import SbatchOptions, SlurmTask, cpus_needed, parse_node_addresses, place, sbatch_script
from fleet.launch.spec import parse_spec
from fleet.launch.winddown import StopBoard, wait_on_board
from foundation.config import ConfigError
from foundation.transport import connect
from tests.conftest import wait_until

SPEC = {
    "run_id": "sl",
    "run_dir": "runs/sl",
    "hosts": {
        "services": {"address": "ignored", "redis": [7000, 7001, 7002], "buffer": 50051, "aggregator": 50052},
        "sim": {"address": "ignored", "sampler": {"count": 2, "cpus": [0, 2]}, "learner": 1, "evaluator": 1},
    },
}


def _srun(script: str) -> list[str]:
    """The batch script's srun of every host, started in the background."""
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return shlex.split(line.removesuffix(" &"))


def _task(proc_id: int, node_id: int | None = None, ntasks: int = 2) -> SlurmTask:
    return SlurmTask("42", proc_id, proc_id if node_id is None else node_id, ntasks, "n[1-2]")


def test_task_i_is_the_spec_s_host_i_at_its_node_s_address_with_the_cpus_slurm_gave_it() -> None:
    spec = parse_spec(SPEC)
    placed = place(spec, _task(1), ["10.0.0.1", "10.0.0.2"], {4, 5, 6, 7})
    assert placed.host == "sim"
    assert [h.address for h in placed.spec.hosts] == ["10.0.0.1", "10.0.0.2"]
    assert placed.spec.service("buffer") == "10.0.0.1:50051"
    sim = placed.spec.host("sim")
    assert sim.workers["sampler"].cpus == (4, 6)  # positions 0 and 2 of the task's CPUs
    assert sim.workers["learner"].cpus == ()  # no pins: the whole allocation, inherited


@pytest.mark.parametrize(
    ("task", "addresses", "cpus", "message"),
    [
        (_task(0, ntasks=3), ["a", "b", "c"], {0, 1, 2}, "3 tasks on 3 nodes (n[1-2]) but the spec 2 hosts"),
        (_task(1, node_id=0), ["a", "b"], {0, 1, 2}, "task 1 runs on node 0"),
        (_task(1), ["a", "b"], {0, 1}, "hosts.sim.sampler.cpus: position 2 must be < 2"),
    ],
)
def test_a_job_that_does_not_fit_the_spec_is_refused_with_the_reason(
    task: SlurmTask, addresses: list[str], cpus: set[int], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        place(parse_spec(SPEC), task, addresses, cpus)


def test_host_auto_outside_a_job_step_says_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_ID, SLURM_PROCID.*not set: it works inside a Slurm job step"):
        SlurmTask.from_env({})


def test_node_addresses_come_from_scontrol_show_node() -> None:
    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.232.7.1 NodeHostName=n1 Version=22.05.8\n"
        "NodeName=n2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.232.7.2 NodeHostName=n2 Version=22.05.8\n"
    )
    assert parse_node_addresses(text) == {"n1": "10.232.7.1", "n2": "10.232.7.2"}


def test_the_batch_script_runs_one_task_per_host_on_as_many_nodes(tmp_path: pathlib.Path) -> None:
    spec = parse_spec({**SPEC, "run_dir": str(tmp_path / "run")})
    options = SbatchOptions(partition="debug", extra=("--account=lab",), host_args=("--set", "sampler.seed=3"))
    script = sbatch_script(spec, tmp_path / "fleet.yaml", max_wall_sec=600.0, options=options)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--time=20",
                 "--partition=debug", "--account=lab", f"--output={tmp_path / 'run'}/slurm-%j.out"):  # fmt: skip
        assert f"#SBATCH {line}" in lines, line
    srun = _srun(script)
    assert srun[:5] == ["srun", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--kill-on-bad-exit=1"]
    assert srun[-6:] == ["up", str(tmp_path / "fleet.yaml"), "--host", "auto", "--set", "sampler.seed=3"]
    assert cpus_needed(spec.host("services")) == 2 and cpus_needed(spec.host("sim")) == 4


def test_the_stop_board_first_reason_wins_an_earlier_fleets_flags_are_history_and_a_gone_cluster_ends_every_wait(
    clean_redis_cluster,
) -> None:
    board = StopBoard(clean_redis_cluster.addresses, clean_redis_cluster.auth, "sl")
    try:
        assert board.reason() is None and board.finished() is False
        board.request("max_wall_sec 60 reached")
        board.request("SIGTERM on services")
        assert board.reason() == "max_wall_sec 60 reached"
        board.workers_stopped("sim")
        assert board.hosts_with_workers_stopped() == {"sim"}
        board.finish()
        assert wait_on_board(board.finished, 5.0, lambda: False) == "done"
        assert board.fleets_seen() == 1
    finally:
        board.close()
    # The next fleet on the kept cluster (a requeued job): the flags above are an earlier fleet's,
    # and a stop flag with no clock reading is no fleet's.
    raw = connect(clean_redis_cluster.addresses, clean_redis_cluster.auth)
    raw.set(board.stop_key, "a reason with no clock reading")
    raw.close()
    again, other_host = (StopBoard(clean_redis_cluster.addresses, clean_redis_cluster.auth, "sl") for _ in range(2))
    try:
        assert again.reason() is None and again.hosts_with_workers_stopped() == set()
        assert wait_on_board(again.finished, 0.3, lambda: False) == "timed out"
        assert again.fleets_seen() == 2  # the cluster kept the earlier fleet's data
        assert other_host.reason() is None  # joins the board now, before this fleet's stop
        again.request("evaluation success 0.95")
        again.request("SIGTERM on services")
        assert other_host.reason() == again.reason() == "evaluation success 0.95"
        other_host.workers_stopped("sim")
        assert again.hosts_with_workers_stopped() == {"sim"}
    finally:
        again.close()
        other_host.close()
    gone = StopBoard("127.0.0.1:1", clean_redis_cluster.auth, "sl")  # nothing listens there
    assert gone.reason() is None
    assert wait_on_board(gone.finished, 30.0, lambda: False) == "board gone"


def test_fleet_slurm_hands_every_host_the_same_config_flags(tmp_path: pathlib.Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(yaml.safe_dump({**SPEC, "run_dir": str(tmp_path / "run")}))
    argv = ["fleet", "slurm", str(spec_path), "--task", "FetchPush-v4", "--set", "sampler.seed=3", "--out", "job.sh"]
    assert main([*argv[:-1], str(tmp_path / "job.sh")]) == 0
    srun = _srun((tmp_path / "job.sh").read_text())
    assert srun[srun.index("auto") + 1 :] == ["--set", "sampler.seed=3", "--task", "FetchPush-v4"]
    assert (tmp_path / "run").is_dir()  # sbatch opens its --output there before the job runs


def test_the_batch_script_runs_in_an_absolute_directory_with_an_absolute_run_dir(tmp_path, monkeypatch) -> None:
    spec = parse_spec({**SPEC, "run_dir": "runs/rel"})  # relative, as a spec usually says it
    monkeypatch.chdir(tmp_path)
    lines = sbatch_script(spec, pathlib.Path("fleet.yaml"), 600.0, SbatchOptions()).splitlines()
    assert f"#SBATCH --chdir={tmp_path}" in lines  # where `fleet up` resolves runs/rel on every node
    assert f"#SBATCH --output={tmp_path}/runs/rel/slurm-%j.out" in lines
    assert f"mkdir -p {tmp_path}/runs/rel" in lines
    elsewhere = SbatchOptions(workdir=str(tmp_path / "lab"))
    assert f"#SBATCH --chdir={tmp_path / 'lab'}" in sbatch_script(spec, tmp_path / "f.yaml", 600.0, elsewhere)


def test_the_batch_script_asks_for_a_warning_and_a_requeue_as_the_spec_says(tmp_path) -> None:
    spec = parse_spec({**SPEC, "run_dir": str(tmp_path / "run")})
    lines = sbatch_script(spec, tmp_path / "fleet.yaml", 600.0, SbatchOptions()).splitlines()
    for line in ("--requeue", "--signal=B:USR1@120", "--open-mode=append"):
        assert f"#SBATCH {line}" in lines, line
    assert any(line.startswith('  scontrol requeue "$SLURM_JOB_ID"') for line in lines)
    quiet = parse_spec({**SPEC, "run_dir": str(tmp_path / "run"), "slurm": {"warning_sec": 0, "requeue": False}})
    script = sbatch_script(quiet, tmp_path / "fleet.yaml", 600.0, SbatchOptions())
    assert "#SBATCH --no-requeue" in script and "#SBATCH --signal" not in script and "scontrol requeue" not in script
    late = parse_spec({**SPEC, "slurm": {"warning_sec": 1200}})
    with pytest.raises(ConfigError, match=r"slurm.warning_sec \(1200\) must be below the job's time limit \(1200 s"):
        sbatch_script(late, tmp_path / "fleet.yaml", 600.0, SbatchOptions())


FAKE_SLURM = {  # what the script calls, each writing what it was asked to calls.log
    "srun": 'echo $$ > "$FAKE/step.pid"; echo "srun $*" >> "$FAKE/calls.log"\n'
    'trap \'echo "step got SIGTERM" >> "$FAKE/calls.log"; exit 0\' TERM\nwhile true; do sleep 0.05; done',
    "scancel": 'echo "scancel $*" >> "$FAKE/calls.log"; kill -TERM "$(cat "$FAKE/step.pid")"',
    "scontrol": 'echo "scontrol $*" >> "$FAKE/calls.log"',
}


def test_the_batch_shell_turns_slurms_warning_into_a_clean_stop_of_the_step_and_a_requeue(tmp_path) -> None:
    """The script's own logic with a fake srun, scancel and scontrol: SIGUSR1 to the batch shell
    (as `--signal=B:USR1` sends it) reaches the step as SIGTERM, the shell waits for the step to
    finish, then requeues the job; a run directory holding lives.jsonl is said to be resumed."""
    fake = tmp_path / "fake"
    fake.mkdir()
    for name, body in FAKE_SLURM.items():
        (fake / name).write_text(f"#!/bin/bash\n{body}\n")
        (fake / name).chmod(0o755)
    run_dir = tmp_path / "run"
    spec = parse_spec({**SPEC, "run_dir": str(run_dir)})
    script = tmp_path / "job.sh"
    script.write_text(sbatch_script(spec, tmp_path / "fleet.yaml", 600.0, SbatchOptions(workdir=str(tmp_path))))
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE": str(fake), "SLURM_JOB_ID": "42"}
    for life in range(2):
        shell = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, text=True)
        wait_until(lambda: (fake / "step.pid").exists(), 10, "the fake step to start")
        shell.send_signal(signal.SIGUSR1)
        out, _ = shell.communicate(timeout=10)
        (fake / "step.pid").unlink()
        events = [line.split(" ", 2)[2].split(":")[0] for line in out.splitlines() if line.startswith("fleetrl-job ")]
        first = "resumed" if life else "started"
        assert (shell.returncode, events) == (0, [first, "warned", "fleet stopped", "requeued"]), out
        (run_dir / "lives.jsonl").write_text('{"life": 0, "event": "start"}\n')  # what the fleet's first life left
    calls = (fake / "calls.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["srun", "scancel", "step", "scontrol"] * 2, calls
    assert calls[1] == "scancel --signal=TERM 42" and calls[3] == "scontrol requeue 42"
