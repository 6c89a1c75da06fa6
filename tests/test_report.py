"""`fleetrl report`: run directories in, one HTML page with PNG plots out."""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import pytest

from fleet.report.render import ReportError, add_arguments, load_run, main, write_report
from foundation.cpu import CpuMeter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
START = 1_700_000_000.0  # started_unix of the synthetic fleet run
FLEET_LABEL = "fleet <script>alert(1)</script>"


def _write_jsonl(path: pathlib.Path, lines: list[object]) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def make_fleet_run(root: pathlib.Path) -> pathlib.Path:
    """Every file a new `fleetrl train` writes; evals without wall_sec, to be derived from started_unix."""
    run = root / "fleet-run"
    run.mkdir()
    summary = {
        "task": "FetchPush-v4",
        "label": FLEET_LABEL,
        "stop_reason": "evaluation success 0.95 >= target 0.9",
        "reached_target": True,
        "target_success": 0.9,
        "wall_sec": 100.0,
        "wall_sec_to_target": 90.0,
        "env_steps_to_target": 4000,
        "final_version": 800,
        "final_env_steps": 4500,
        "best_success": 0.95,
        "started_unix": START,
        "updates_per_sec": 8.0,
        "fleet_overhead_share": 0.125,
        "cpu": _cpu_block(),
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.json").write_text(json.dumps({"sim": {"task": "FetchPush-v4"}, "sampler": {"seed": 7}}))
    evals = [
        {"version": v, "success_rate": s, "episodes": 10, "env_steps": 1000 * k, "time": START + 30 * k}
        for k, (v, s) in enumerate([(0, 0.0), (300, 0.4), (600, 0.95)])
    ]
    _write_jsonl(run / "evals.jsonl", [*evals, {**evals[1], "kind": "full", "episodes": 50}])
    progress = [
        {"wall_sec": 10.0 * k, "env_steps": 450 * k, "version": 80 * k, "updates_per_sec": 8.0}
        | {"env_steps_per_sec": 45.0, "eval_success": 0.1 * k, "train_success": None if k == 0 else 0.09 * k}
        for k in range(11)
    ]
    _write_jsonl(run / "progress.jsonl", progress)
    return run


def _cpu_block() -> dict:
    """What the launcher writes: two samplers' and a learner's processes, 100 s on 2 cores."""
    meter = CpuMeter()
    for name, pid, sec in (("learner-0", 10, 50.0), ("sampler-0", 11, 12.0), ("sampler-1", 12, 8.0)):
        meter.record(name, pid, sec)
    return meter.report(wall_sec=100.0, cores=2)


def make_baseline_run(root: pathlib.Path) -> pathlib.Path:
    """What sb3_baseline.py --out writes: summary.json and evals.jsonl only; one line here is broken."""
    run = root / "sb3-seed0"
    run.mkdir()
    summary = {
        "task": "FetchPush-v4",
        "label": "SB3 SAC+HER seed 0",
        "stop_reason": "max_wall_sec 1200.0 reached",
        "reached_target": False,
        "target_success": 0.9,
        "wall_sec": 1200.0,
        "started_unix": START,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    evals = [
        {"version": 0, "success_rate": 0.0, "episodes": 20, "env_steps": 500, "time": START + 60, "wall_sec": 60.0},
        '{"version": 10, "success_rate": 0.',  # truncated, as by a crash mid-write
        {"version": 500, "success_rate": 0.3, "episodes": 20, "env_steps": 1000, "time": START + 9, "wall_sec": 120.0},
    ]
    _write_jsonl(run / "evals.jsonl", evals)
    return run


def _images(page: pathlib.Path) -> list[pathlib.Path]:
    return [page.parent / src for src in re.findall(r'<img src="([^"]+)"', page.read_text())]


def test_report_compares_both_runs_with_valid_pngs(tmp_path: pathlib.Path) -> None:
    runs = [load_run(make_fleet_run(tmp_path)), load_run(make_baseline_run(tmp_path))]
    page = write_report(runs, tmp_path / "out" / "report.html", "Push <fleet vs SB3>")

    text = page.read_text()
    assert "<script>" not in text
    assert "fleet &lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "SB3 SAC+HER seed 0" in text
    assert "evaluation success 0.95 &gt;= target 0.9" in text
    assert "max_wall_sec 1200.0 reached" in text
    assert "<title>Push &lt;fleet vs SB3&gt;</title>" in text
    assert "90.0 s (1.5 min)" in text  # wall-clock to target
    assert "12.5%" in text  # fleet overhead share
    assert "<td>7</td>" in text  # seed from config.json
    assert "<th>learner</th><th>sampler</th>" in text  # CPU per role: every sampler together
    assert "<td>25.0% (50.0 s)</td><td>10.0% (20.0 s)</td>" in text
    assert "1 malformed JSONL line(s) skipped" in text
    images = _images(page)
    assert [p.name for p in images] == [
        "eval_wall.png",
        "eval_env_steps.png",
        "train_wall.png",
        "updates_wall.png",
        "cpu_share.png",
    ]
    for image in images:
        assert image.parent == tmp_path / "out" / "report_files"
        assert image.read_bytes()[:8] == PNG_MAGIC, image


def test_optional_plots_are_left_out_and_stale_ones_removed(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "report.html"
    write_report([load_run(make_fleet_run(tmp_path))], out, "first")
    baseline = load_run(make_baseline_run(tmp_path))
    write_report([baseline], out, "second")

    assert [p.name for p in _images(out)] == ["eval_wall.png", "eval_env_steps.png"]
    assert sorted(p.name for p in (tmp_path / "report_files").iterdir()) == ["eval_env_steps.png", "eval_wall.png"]


def test_load_run_derives_wall_sec_and_skips_malformed_lines(tmp_path: pathlib.Path) -> None:
    fleet = load_run(make_fleet_run(tmp_path))
    baseline = load_run(make_baseline_run(tmp_path))

    assert fleet.name == FLEET_LABEL
    assert [e["wall_sec"] for e in fleet.evals] == [0.0, 30.0, 60.0, 30.0]
    assert set(fleet.cpu) == {"learner", "sampler"}
    assert fleet.skipped_lines == 0
    assert baseline.skipped_lines == 1
    assert [e["version"] for e in baseline.evals] == [0, 500]
    assert baseline.progress == [] and baseline.cpu == {}


def test_name_falls_back_to_directory_name(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "unlabelled"
    run.mkdir()
    _write_jsonl(run / "evals.jsonl", [{"version": 0, "success_rate": 0.5, "episodes": 4, "env_steps": 10}])

    loaded = load_run(run)

    assert loaded.name == "unlabelled"
    assert loaded.evals[0]["wall_sec"] is None  # neither wall_sec nor started_unix


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d.mkdir(), "has neither summary.json nor evals.jsonl"),
        (lambda d: None, "does not exist"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text("{not json")), "summary.json is not valid JSON"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text("[1]")), "must hold a JSON object, got list"),
    ],
)
def test_load_run_rejects_unusable_dirs_naming_the_path(tmp_path: pathlib.Path, setup, message: str) -> None:
    run = tmp_path / "bad-run"
    setup(run)

    with pytest.raises(ReportError, match=re.escape(message)) as err:
        load_run(run)
    assert str(run) in str(err.value)


def test_main_prints_the_page_path(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "cmp.html"
    args = parser.parse_args([str(make_baseline_run(tmp_path)), "--out", str(out)])

    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert "1 malformed JSONL line(s) skipped" in captured.err
    assert "<title>fleetrl report: SB3 SAC+HER seed 0</title>" in out.read_text()


def test_a_multi_task_moe_run_gets_per_task_curves_and_its_expert_routing(tmp_path: pathlib.Path) -> None:
    from fleet.report.figures import task_curves
    from foundation.policy import ModelSpec
    from foundation.routing_stats import expert_routing
    from nets.models import SACModel

    run = make_fleet_run(tmp_path)
    spec = ModelSpec(7, 3, 2, hidden_sizes=(8,), kind="moe", experts=6, top_k=2, tasks=2, router="task")
    model = SACModel(spec)
    groups = {g: model.get_flat(g) for g in ("actor", "critic")}
    summary = json.loads((run / "summary.json").read_text())
    summary["expert_routing"] = expert_routing(spec, groups, ["FetchReach-v4", "FetchPush-v4"]) | {"version": 9}
    (run / "summary.json").write_text(json.dumps(summary))
    evals = [
        {"version": k, "success_rate": k / 4, "episodes": 10, "env_steps": 100 * k, "time": START + 60 * k}
        | {"task_success": {"FetchReach-v4": k / 2, "FetchPush-v4": 0.0}}
        for k in range(3)
    ]
    _write_jsonl(run / "evals.jsonl", evals)
    loaded = load_run(run)
    assert task_curves(loaded.evals) == {
        "FetchPush-v4": [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)],
        "FetchReach-v4": [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)],
    }
    page = write_report([loaded], tmp_path / "report.html", "multi-task")
    names = [p.name for p in _images(page)]
    assert names[-3:] == ["task_success.png", "expert_routing.png", "expert_overlap.png"]
    assert "version 9" in page.read_text() and "Expert overlap between tasks" in page.read_text()
    for image in _images(page):
        assert image.read_bytes()[:8] == PNG_MAGIC, image


def test_main_writes_into_the_first_run_directory_by_default(tmp_path: pathlib.Path, monkeypatch) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    fleet, baseline = make_fleet_run(tmp_path), make_baseline_run(tmp_path)
    monkeypatch.chdir(tmp_path)  # not where the page goes

    assert main(parser.parse_args([str(fleet), str(baseline)])) == 0
    assert (fleet / "report.html").exists() and (fleet / "report_files" / "cpu_share.png").exists()
    assert not (tmp_path / "report.html").exists()


def test_the_page_labels_its_rates_and_says_what_its_scores_are(tmp_path: pathlib.Path) -> None:
    page = write_report([load_run(make_fleet_run(tmp_path))], tmp_path / "report.html", "labels")
    text = page.read_text()
    assert "<th>updates/s (whole-run mean)</th>" in text and "<td>8.0</td>" in text
    assert "Updates per second (rate over the last 30 s)" in text  # the plot's caption
    glossary = text[text.index("What the terms mean") : text.index("</dl>")]
    for term in ("curve score", "full score", "training success", "evaluation success"):
        assert f"<dt>{term}</dt>" in glossary, term
    assert "50 deterministic episodes" in glossary and "exploration noise and random actions" in glossary


def test_the_page_says_what_each_run_ran_with(tmp_path: pathlib.Path) -> None:
    fleet = make_fleet_run(tmp_path)
    config = {"preset": "FetchPush-v4", "sim": {"task": "FetchPush-v4"}, "sampler": {"seed": 7}, "gone": 1}
    (fleet / "config.json").write_text(json.dumps(config))
    (fleet / "code.json").write_text(json.dumps({"fleetrl": "0.1.0", "commit": "abc123+dirty"}))
    baseline = make_baseline_run(tmp_path)  # no config.json, no code.json: dashes, not a refusal
    summary = json.loads((baseline / "summary.json").read_text()) | {"code": {"commit": "def456"}}
    (baseline / "summary.json").write_text(json.dumps(summary))
    runs = [load_run(fleet), load_run(baseline)]
    assert runs[0].code["commit"] == "abc123+dirty" and runs[1].code["commit"] == "def456"

    text = write_report(runs, tmp_path / "report.html", "setup").read_text()
    section = text[text.index("What each run ran with") :]
    assert "<td>FetchPush-v4</td><td>abc123+dirty</td><td>0.1.0</td>" in section
    assert "sim.task = &#x27;FetchPush-v4&#x27; (default &#x27;FetchReach-v4&#x27;)" in section
    assert "sampler.seed = 7 (default 0)" in section and "gone = 1 (not a field of this fleetrl)" in section
    assert "learner.gamma" not in section  # a field at its default is not listed
    assert "<td>—</td><td>def456</td>" in section


def test_each_task_has_its_own_colour_and_each_run_its_own_line_style(tmp_path: pathlib.Path) -> None:
    from matplotlib.colors import to_hex

    from fleet.report.figures import task_curve_figure

    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        evals = [
            {"version": k, "success_rate": 0.5, "episodes": 10, "env_steps": k, "wall_sec": 60.0 * k}
            | {"task_success": {"FetchReach-v4": 0.9, "FetchPush-v4": 0.2, "FetchSlide-v4": 0.1}}
            for k in range(3)
        ]
        _write_jsonl(run / "evals.jsonl", evals)
        runs.append(load_run(run))
    figure = task_curve_figure(runs, str)
    assert figure is not None
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    colour = {label: to_hex(line.get_color()) for label, line in lines.items()}
    tasks = ("FetchPush-v4", "FetchReach-v4", "FetchSlide-v4")
    assert len({colour[f"a: {t}"] for t in tasks}) == 3  # three tasks, three colours
    assert all(colour[f"a: {t}"] == colour[f"b: {t}"] for t in tasks)  # a task keeps its colour over runs
    assert {lines[f"a: {t}"].get_linestyle() for t in tasks} != {lines[f"b: {t}"].get_linestyle() for t in tasks}


def test_the_overlap_matrix_is_each_pair_s_overlap_averaged_over_the_actor_s_layers() -> None:
    from fleet.report.figures import overlap_matrix

    def layer(overlap: float) -> dict:
        return {"tasks": {"a": {}, "b": {}, "c": {}}, "overlap": {"a|b": overlap, "a|c": 0.0, "b|c": 1.0}}

    routing = {"actor": {"l0": layer(0.2), "l1": layer(0.6)}, "critic.q1": {"l0": layer(1.0)}}
    tasks, matrix = overlap_matrix(routing)
    assert tasks == ["a", "b", "c"]
    assert matrix[0][1] == matrix[1][0] == pytest.approx(0.4)  # the actor's layers only
    assert matrix[0][2] == 0.0 and matrix[1][2] == 1.0 and [matrix[i][i] for i in range(3)] == [1.0, 1.0, 1.0]
    assert overlap_matrix({"critic.q1": {}}) is None


def test_a_run_s_robustness_envelope_is_shown_on_the_page(tmp_path: pathlib.Path) -> None:
    run = make_fleet_run(tmp_path)
    first = _images(write_report([load_run(run)], tmp_path / "plain.html", "plain"))[0]
    (run / "envelope").mkdir()
    (run / "envelope" / "FetchPush-v4.png").write_bytes(first.read_bytes())  # any PNG stands for the sweep's
    page = write_report([load_run(run)], tmp_path / "report.html", "with envelope")
    assert any(p.name.endswith("FetchPush-v4.png") and p.name.startswith("envelope_") for p in _images(page))
    assert "Robustness envelope of FetchPush-v4" in page.read_text()
