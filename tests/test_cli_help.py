"""What a new user reads: every --help shows defaults, an example and the exit codes; --version;
`fleetrl config` fits the terminal, prints only the changes on request, and the run_dir train uses."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from fleet.cli.main import main
from foundation.config import RunConfig, config_changes, help_lines, with_overrides

SUBCOMMANDS = [
    ["train"], ["config"], ["redis-cluster"], ["buffer"], ["aggregator"], ["learner"], ["sampler"], ["evaluator"],
    ["certs"], ["fleet"], ["fleet", "up"], ["fleet", "slurm"], ["fleet", "check"], ["fleet", "render"], ["evaluate"],
    ["report"], ["deploy-check"], ["export"],
]  # fmt: skip
HEAVY = ("torch", "onnxruntime", "matplotlib", "deploy_npu", "numpy")


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=[" ".join(a) for a in SUBCOMMANDS])
def test_every_help_shows_an_example_and_the_exit_codes(argv, capsys):
    text = _help(argv, capsys)
    assert "example:\n  fleetrl " in text or "examples:\n  fleetrl " in text
    assert "exit status:\n  0    success\n  1    a runtime failure" in text and "\n  2    a usage or config" in text
    assert "fleetrl <subcommand>: error: <message>" in text


@pytest.mark.parametrize(
    "argv,shown",
    [
        (["train"], "(default: async)"),
        (["redis-cluster"], "(default: 3)"),
        (["evaluate"], "(default: 50)"),
        (["deploy-check"], "(default: 120.0)"),
        (["export"], "(default: 17)"),
        (["fleet", "render"], "(default: k8s)"),
        (["fleet", "render"], "(default: fleetrl:latest)"),
    ],
)
def test_help_shows_the_defaults(argv, shown, capsys):
    assert shown in " ".join(_help(argv, capsys).split())


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"fleetrl {metadata.version('fleetrl')}"


@pytest.mark.parametrize("argv", [["export"], ["train"], ["fleet", "render"], ["report"]])
def test_help_loads_no_heavy_module(argv):
    """What keeps every --help under a second: no torch, onnxruntime, matplotlib or numpy to load."""
    code = (
        "import sys\nfrom fleet.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv, "--help"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr


def test_the_export_parsers_defaults_are_the_checks_defaults():
    from deploy_npu.pipeline import DeployCheckConfig
    from fleet.cli.args import build_parser
    from foundation.checkpoint import WEIGHT_CHOICES

    args = build_parser("fleetrl").parse_args(["export", "runs/r"])
    d = DeployCheckConfig()
    assert (args.episodes, args.opset, args.batch_size, args.tolerance) == (
        d.episodes,
        d.opset,
        d.batch_size,
        d.tolerance,
    )
    assert (args.latency_calls, args.budget_ms, args.seed, args.weights) == (
        d.latency_calls,
        d.budget_ms,
        d.seed,
        d.weights,
    )
    assert (args.hz, args.trained_hz, args.int8) == (d.control_hz, d.trained_hz, d.int8)
    from fleet.cli.export_args import WEIGHT_CHOICES as PARSER_CHOICES

    assert PARSER_CHOICES == WEIGHT_CHOICES


def test_config_lines_fit_the_terminal_cutting_long_helps_at_their_first_clause():
    lines = help_lines(RunConfig(), width=100)
    assert len(lines) == len(help_lines(RunConfig()))  # every field, one line each
    long_values = [line for line in lines if len(line.split("  # ")[0]) > 100 - 24]
    assert all(len(line) <= 100 for line in lines if line not in long_values)
    preset = next(line for line in help_lines(RunConfig(), width=60) if line.startswith("preset = "))
    assert preset.endswith("# task preset applied under the overrides")  # cut before " (fleet/cli/presets.py)"


def test_config_changed_prints_only_what_differs_from_the_defaults(capsys):
    assert main(["config", "--task", "FetchPush-v4", "--set", "sampler.seed=5", "--changed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "sampler.seed = 5  [default 0]" in out
    assert "sim.task = 'FetchPush-v4'  [default 'FetchReach-v4']" in out
    assert not any(line.startswith(("target_success", "learner.lr ")) for line in out)
    changed = config_changes(with_overrides(RunConfig(), ["sampler.seed=5"]))
    assert [(c.name, c.value, c.default) for c in changed] == [("sampler.seed", 5, 0)]


def test_config_prints_the_run_dir_train_would_use(monkeypatch, capsys):
    from tests.test_cli import _FakeFleet

    monkeypatch.setattr("fleet.cli.resolve.default_run_dir", lambda config, now=None: f"runs/{config.sim.task}-T")
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    assert main(["config", "--task", "FetchPush-v4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["run_dir"]
    assert main(["train", "--task", "FetchPush-v4"]) == 0
    capsys.readouterr()
    assert printed == _FakeFleet.built[-1][0].run_dir == "runs/FetchPush-v4-T"
    assert main(["config", "--task", "FetchPush-v4", "--set", 'run_dir="mine"', "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_dir"] == "mine"
