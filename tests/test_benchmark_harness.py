"""benchmarks/harness.py's pure parts: the interleaved order, medians, the table and the raw result."""

from __future__ import annotations

import importlib
import json
import pathlib
import re

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("harness")


def test_arms_alternate_within_each_repeat(harness):
    order = harness.interleaved_order(["a", "b"], 3)
    assert [t.arm for t in order] == ["a", "b", "a", "b", "a", "b"]
    assert [t.repeat for t in order] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("arms", "repeats", "says"),
    [
        (["a"], 0, r"repeats \(0\) must be >= 1"),
        ([], 2, "arms is empty"),
        (["a", "b", "a"], 1, "name an arm twice"),
    ],
)
def test_a_schedule_that_measures_nothing_or_mixes_arms_is_refused(harness, arms, repeats, says):
    with pytest.raises(ValueError, match=says):
        harness.interleaved_order(arms, repeats)


@pytest.mark.parametrize(("text", "says"), [("0", "must be >= 1"), ("-2", "must be >= 1"), ("two", "not a whole")])
def test_a_repeats_flag_below_one_is_refused_at_the_door(harness, text, says):
    import argparse

    assert harness.repeats_arg("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        harness.repeats_arg(text)


def test_run_interleaved_calls_the_arms_in_turn_with_the_repeat_index(harness, capsys):
    calls = []

    def arm(name):
        def measure(repeat):
            calls.append((name, repeat))
            return {"rate": 10.0 * (repeat + 1) + (name == "b"), "label": name}

        return measure

    runs = harness.run_interleaved({"a": arm("a"), "b": arm("b")}, repeats=2)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert runs == {
        "a": [{"rate": 10.0, "label": "a"}, {"rate": 20.0, "label": "a"}],
        "b": [{"rate": 11.0, "label": "b"}, {"rate": 21.0, "label": "b"}],
    }
    assert "[4/4] repeat 2/2: b" in capsys.readouterr().err


def test_medians_skip_missing_values_and_non_numeric_figures(harness):
    runs = {"a": [{"x": 1.0, "y": None, "s": "t"}, {"x": 3.0, "y": 2.0}, {"x": 10.0, "y": None}], "b": [{"x": None}]}
    assert harness.median_figures(runs) == {"a": {"x": 3.0, "y": 2.0}, "b": {"x": None}}


def test_median_and_worst_are_none_unless_every_run_has_a_value(harness):
    assert harness.median_and_worst([12.5, 15.9, 14.8]) == (14.8, 15.9)
    assert harness.median_and_worst([1.234, 2.0], digits=2) == (1.62, 2.0)
    assert harness.median_and_worst([12.5, None, 14.8]) == (None, None)  # a miss hides no seed
    assert harness.median_and_worst([]) == (None, None)


def test_ratio_is_none_where_a_side_is_missing_or_zero(harness):
    assert harness.ratio(3.0, 4.0) == 0.75
    assert harness.ratio(None, 4.0) is None
    assert harness.ratio(3.0, 0.0) is None


def test_paired_ratios_divide_within_each_repeat_and_skip_a_missing_figure(harness):
    runs = {"a": [{"t": 2.0}, {"t": 9.0}, {"t": None}], "b": [{"t": 1.0}, {"t": 3.0}, {"t": 1.0}]}
    assert harness.paired_ratios(runs, "a", "b", "t") == [2.0, 3.0]
    with pytest.raises(ValueError):  # a repeat without its pair: the ratios would not be paired
        harness.paired_ratios({"a": [{"t": 1.0}], "b": []}, "a", "b", "t")


def test_the_table_has_a_row_per_arm_and_a_column_per_figure(harness):
    rows = {"dense": {"updates/s": 1234.5, "share": 0.1234, "runs": 3}, "moe": {"updates/s": None, "share": 1.6667}}
    text = harness.table_text(harness.build_table("medians of 3", rows))
    assert "medians of 3" in text
    lines = [line for line in text.splitlines() if "dense" in line or "moe" in line]
    assert re.search(r"dense .*1,234\.5 .*0\.123 .*3", lines[0])
    assert re.search(r"moe .* - .*1\.667 ", lines[1])
    only = harness.table_text(harness.build_table("t", rows, columns=["share"]))
    assert "updates/s" not in only and "0.123" in only


def test_cpu_model_reads_the_first_model_name(harness):
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nmodel name\t: other\n"
    assert harness.cpu_model(cpuinfo) == "AMD EPYC 7B13"
    assert harness.cpu_model("processor\t: 0\n") == "unknown"


def test_the_raw_result_says_what_made_its_figures(harness, tmp_path, capsys):
    argv = [str(BENCHMARKS / "x.py"), "--seconds", "5", "--set", "a b"]
    record = harness.result_record("x", {"rate": 1.5}, argv=argv)
    assert record["benchmark"] == "x"
    assert record["command"] == "python3 benchmarks/x.py --seconds 5 --set 'a b'"
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", record["commit"])
    assert record["machine"]["cores"] >= record["machine"]["usable_cores"] >= 1
    assert record["machine"]["cpu"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["date"])
    assert record["figures"] == {"rate": 1.5}
    out = tmp_path / "sub" / "r.json"
    harness.write_result(record, out)
    assert json.loads(out.read_text()) == record
    assert str(out) in capsys.readouterr().err


def test_every_script_is_in_the_readme_with_its_command():
    """Each script has a row in the index and a section that shows how to run it."""
    readme = (BENCHMARKS / "README.md").read_text()
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())
    assert scripts
    for name in scripts:
        assert f"| `{name}` |" in readme, f"{name}: no row in the README's index"
        assert f"## `{name}`" in readme, f"{name}: no section in the README"
        assert f"python3 benchmarks/{name}" in readme, f"{name}: the README shows no command"


def test_the_scripts_and_readme_speak_of_the_product_not_of_its_history():
    history = re.compile(r"\b(stop|issue|preset)[ -]\d+|\bstops? \d+-\d+|\bfinding \d", re.IGNORECASE)
    for path in [BENCHMARKS / "README.md", *BENCHMARKS.glob("*.py")]:
        found = [m.group(0) for m in history.finditer(path.read_text())]
        assert not found, f"{path.name}: {found}"


def test_the_cpu_meter_charges_a_busy_process_and_counts_the_rest_as_others(harness):
    import os
    import time

    meter = harness.CpuMeter({"me": os.getpid()})
    meter.start()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 CPU-seconds of this process
        pass
    used = meter.stop()
    assert used["me"] > 10.0  # percent of one core over the window
    assert used["machine"] >= used["others"] >= 0.0
    assert set(used) == {"me", "machine", "others"}
