"""One error surface: every subcommand that takes a run directory, a task or --set refuses a
missing run directory, an empty one, a typo'd task and a bad --set with `fleetrl <subcommand>:
error: <message naming the thing>`, exit status 2, and no traceback."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from fleet.cli.main import main
from tests.test_fleet_spec import README_SPEC

TYPO_HINT = "did you mean 'FetchReach-v4'?"


def _dirs(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """A missing run directory, an empty one, and one with a config but no checkpoint yet."""
    empty, started = root / "empty", root / "started"
    empty.mkdir()
    started.mkdir()
    (started / "config.json").write_text(json.dumps({"run_id": "started"}))
    spec = root / "fleet.yaml"
    spec.write_text(README_SPEC)
    (root / "typo.yaml").write_text(README_SPEC.replace("sim.task: FetchPush-v4", "sim.task: FetchReah-v4"))
    (root / "empty.yaml").write_text("")
    return {"missing": root / "nope", "empty": empty, "started": started, "spec": spec, "root": root}


# (case id, argv with {placeholders}, the subcommand's prefix, what the message must say)
CASES = [
    ("train/missing", ["train", "--resume", "{missing}"], "train", "{missing}: does not exist"),
    ("train/empty", ["train", "--resume", "{empty}"], "train", "{empty}: no config.json there"),
    ("train/typo", ["train", "--task", "FetchReah-v4"], "train", TYPO_HINT),
    ("train/tasks-typo", ["train", "--tasks", "FetchReach-v4,FetchPsh-v4"], "train", "did you mean 'FetchPush-v4'?"),
    ("train/tasks-empty", ["train", "--tasks", "FetchReach-v4,,FetchPush-v4"], "train", "item 2 is empty"),
    ("train/set", ["train", "--set", "sampler.her_kk=1"], "train", "unknown config field 'sampler.her_kk'"),
    (
        "train/tasks-apart",  # FetchPush-v4's preset names the run (preset_task); --tasks would name FetchReach-v4
        ["train", "--set", 'sim.tasks=["FetchReach-v4","FetchPush-v4"]'],
        "train",
        "sim.task ('FetchPush-v4') must be sim.tasks[0] ('FetchReach-v4') when sim.tasks is set: the run trains "
        "sim.tasks and is named and reported after sim.task; --tasks sets both",
    ),
    (
        "train/grasped-start-range",
        ["train", "--task", "FetchPickAndPlace-v4", "--set", "sim.grasped_start=2"],
        "train",
        "sim.grasped_start (2.0) must be in [0, 1]",
    ),
    (
        "train/grasped-start-task",
        ["train", "--task", "FetchPush-v4", "--set", "sim.grasped_start=0.5"],
        "train",
        "sim.grasped_start (0.5) must be 0 for a run of FetchPush-v4: only a task whose gripper can grasp",
    ),
    ("config/missing", ["config", "--config", "{missing}/config.json"], "config", "{missing}/config.json: no such"),
    ("config/empty", ["config", "--config", "{empty}"], "config", "{empty}: a folder, not a RunConfig JSON"),
    ("config/typo", ["config", "--task", "FetchReah-v4"], "config", TYPO_HINT),
    ("config/tasks-empty", ["config", "--tasks", "FetchReach-v4,,FetchPsh-v4"], "config", "item 2 is empty"),
    ("config/set", ["config", "--set", "samplr.seed=1"], "config", "unknown config section 'samplr.seed'"),
    (
        "config/tasks-apart",
        ["config", "--set", 'sim.tasks=["FetchReach-v4","FetchPush-v4"]'],
        "config",
        "sim.task ('FetchPush-v4') must be sim.tasks[0] ('FetchReach-v4') when sim.tasks is set",
    ),
    ("evaluate/missing", ["evaluate", "{missing}"], "evaluate", "{missing}: does not exist"),
    ("evaluate/empty", ["evaluate", "{empty}"], "evaluate", "{empty}: no config.json there"),
    ("evaluate/no-checkpoint", ["evaluate", "{started}"], "evaluate", "no checkpoint in {started}/checkpoints"),
    ("evaluate/set", ["evaluate", "{started}", "--set", "x=1"], "evaluate", "unrecognized arguments: --set"),
    ("evaluate/out", ["evaluate", "{started}", "--out", "{root}"], "evaluate", "--out is read only with --why"),
    ("evaluate/why-out", ["evaluate", "{started}", "--why", "--out", "{spec}"], "evaluate", "--out {spec}: a file"),
    ("deploy-check/missing", ["deploy-check", "{missing}"], "deploy-check", "{missing}: does not exist"),
    ("deploy-check/empty", ["deploy-check", "{empty}"], "deploy-check", "{empty}: no config.json there"),
    ("deploy-check/no-checkpoint", ["deploy-check", "{started}"], "deploy-check", "no checkpoint in {started}"),
    (
        "deploy-check/ranges-alone",
        ["deploy-check", "{started}", "--ranges-from", "{started}"],
        "deploy-check",
        "--ranges-from is read only with --sweep",
    ),
    (
        "deploy-check/ranges-missing",
        ["deploy-check", "{started}", "--sweep", "--ranges-from", "{missing}"],
        "deploy-check",
        "--ranges-from {missing}: does not exist",
    ),
    (
        "deploy-check/ranges-empty",
        ["deploy-check", "{started}", "--sweep", "--ranges-from", "{empty}"],
        "deploy-check",
        "--ranges-from {empty}: no config.json there",
    ),
    (
        "deploy-check/ranges-not-config",
        ["deploy-check", "{started}", "--sweep", "--ranges-from", "{spec}"],
        "deploy-check",
        "--ranges-from {spec}: not a RunConfig JSON",
    ),
    ("export/missing", ["export", "{missing}"], "export", "{missing}: does not exist"),
    ("export/empty", ["export", "{empty}"], "export", "{empty}: no config.json there"),
    ("export/no-checkpoint", ["export", "{started}"], "export", "no checkpoint in {started}/checkpoints"),
    ("export/typo", ["export", "{started}", "--task", "FetchReah-v4"], "export", TYPO_HINT),
    ("export/neither", ["export"], "export", "a run directory (RUN_DIR) or --checkpoint"),
    ("report/missing", ["report", "{missing}"], "report", "{missing} does not exist"),
    ("report/empty", ["report", "{empty}"], "report", "{empty} has neither summary.json nor evals.jsonl"),
    ("fleet check/missing", ["fleet", "check", "{missing}.yaml"], "fleet check", "{missing}.yaml: [Errno 2]"),
    (
        "fleet check/empty",
        ["fleet", "check", "{root}/empty.yaml"],
        "fleet check",
        "empty.yaml (None) must be a fleet spec",
    ),
    ("fleet check/typo", ["fleet", "check", "{root}/typo.yaml"], "fleet check", "typo.yaml:2: config.sim.task"),
    ("fleet check/task", ["fleet", "check", "{spec}", "--task", "FetchReah-v4"], "fleet check", TYPO_HINT),
    ("fleet check/set", ["fleet", "check", "{spec}", "--set", "sim.tsk=1"], "fleet check", "unknown config field"),
    ("fleet render/missing", ["fleet", "render", "{missing}.yaml"], "fleet render", "{missing}.yaml: [Errno 2]"),
    ("fleet render/typo", ["fleet", "render", "{root}/typo.yaml"], "fleet render", TYPO_HINT),
    ("fleet render/set", ["fleet", "render", "{spec}", "--set", "sim.tsk=1"], "fleet render", "unknown config field"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as done:  # argparse's own usage errors
        status = int(done.code or 0)
    return status, capsys.readouterr().err


@pytest.mark.parametrize("case,argv,sub,message", CASES, ids=[c[0] for c in CASES])
def test_a_users_mistake_is_one_line_with_the_prefix_and_exit_2(
    case, argv, sub, message, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", None)  # nothing may start: the door refuses first
    monkeypatch.chdir(tmp_path)
    where = {k: str(v) for k, v in _dirs(tmp_path).items()}
    status, err = _run([arg.format(**where) for arg in argv], capsys)
    assert status == 2, err
    assert f"fleetrl {sub}: error: " in err and message.format(**where) in err, err
    assert "Traceback" not in err


def test_deploy_check_of_a_missing_run_dir_in_a_real_process_has_no_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli.main", "deploy-check", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"fleetrl deploy-check: error: run directory {tmp_path / 'nope'}: does not exist")


def test_a_runtime_failure_exits_1_and_ctrl_c_130(monkeypatch, capsys):
    from fleet.cli import main as cli

    def refused(args):
        raise ConnectionRefusedError("127.0.0.1:7000 refused the connection")

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.HANDLERS, "certs", refused)
    assert main(["certs", "--out", "x"]) == 1
    assert "fleetrl certs: error: 127.0.0.1:7000 refused" in capsys.readouterr().err
    monkeypatch.setitem(cli.HANDLERS, "certs", interrupted)
    assert main(["certs", "--out", "x"]) == 130
    assert "fleetrl certs: error: interrupted" in capsys.readouterr().err


def test_no_handler_changes_its_arguments(tmp_path, monkeypatch):
    """Resolving --resume, --redis-replicas and a fleet spec builds new values; args stay as parsed."""
    from fleet.cli import commands
    from fleet.cli.args import build_parser
    from tests.test_cli import _FakeFleet

    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_id": "r", "run_dir": str(run)}))
    args = build_parser("fleetrl").parse_args(["train", "--resume", str(run), "--redis-replicas", "1"])
    before = dict(vars(args))
    assert commands.train(args) == 0
    assert vars(args) == before
    [(config, _)] = _FakeFleet.built[-1:]
    assert config.run_dir == str(run) and config.buffer.replicas_to_ack == 1
