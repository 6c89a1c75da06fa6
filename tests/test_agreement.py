"""The agreement check (deploy_npu/agreement.py, agreement_run.py): the pairwise figures as pure
logic, and real controllers of one policy driven over the same FetchReach episodes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from deploy_npu.agreement import (
    INT8,
    ONNX,
    PAIRS,
    TORCH,
    TORCH_AGAIN,
    TORCH_EPS,
    AgreementReport,
    AgreementSetting,
    EpisodeTrace,
    PairFigures,
    compare,
    first_divergence,
    median_tick,
    paired_se,
    same_input_action_gap,
)
from foundation.config import ConfigError

_PATH = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])


def _moved(tick: int, by: float, path: np.ndarray = _PATH) -> np.ndarray:
    moved = path.copy()
    moved[tick:, 1] += by
    return moved


@pytest.mark.parametrize(
    ("a", "b", "threshold", "expected"),
    [
        (_PATH, _PATH, 1e-4, None),  # identical: never parts
        (_PATH, _moved(2, 2e-4), 1e-4, 2),  # past the threshold from tick 2 on
        (_PATH, _moved(1, 0.25), 0.25, None),  # exactly at the threshold (binary-exact): not past it
        (_PATH, _moved(1, 5e-5), 0.0, 1),  # threshold 0: any difference parts them
        (_PATH, _PATH[:3], 1e-4, 3),  # the same path until the shorter one ends
        (_PATH[:0], _PATH[:0], 1e-4, None),  # no ticks at all
    ],
)
def test_first_divergence_is_the_first_tick_past_the_threshold(a, b, threshold, expected):
    assert first_divergence(a, b, threshold) == expected
    assert first_divergence(b, a, threshold) == expected  # symmetric


@pytest.mark.parametrize("threshold", [-1e-4, math.nan, math.inf])
def test_first_divergence_refuses_a_threshold_that_means_nothing(threshold):
    with pytest.raises(ConfigError, match="divergence threshold"):
        first_divergence(_PATH, _PATH, threshold)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1, 0, 1, 0], [1, 0, 1, 0], 0.0),  # no flip: no spread
        ([1, 1, 0, 0], [0, 0, 0, 0], math.sqrt(1 / 3) / 2),  # d = 1, 1, 0, 0: sd sqrt(1/3), n 4
        ([1, 0], [0, 1], 1.0),  # d = 1, -1: sd sqrt(2), n 2
        ([1], [0], None),  # one episode: no spread to estimate
    ],
)
def test_paired_se_is_the_sample_sd_of_the_differences_over_root_n(a, b, expected):
    got = paired_se([bool(x) for x in a], [bool(x) for x in b])
    assert got == expected if expected is None else got == pytest.approx(expected)


def test_paired_se_refuses_outcomes_of_different_episodes():
    with pytest.raises(ValueError, match="equal lengths: 2 and 3"):
        paired_se([True, False], [True, False, True])


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        ([], None),
        ([3], 3.0),
        ([2, 4], 3.0),
        ([1, None, 5], 5.0),  # never counts as later than any tick
        ([1, None], None),  # half never part: no median tick
        ([None, None, 7], None),
    ],
)
def test_median_tick_counts_an_episode_that_never_parts_as_the_latest(ticks, expected):
    assert median_tick(ticks) == expected


def _trace(inputs, actions, success=True, achieved=None) -> EpisodeTrace:
    inputs, actions = np.array(inputs, np.float32), np.array(actions, np.float64)
    achieved = np.zeros((len(inputs), 3)) if achieved is None else np.asarray(achieved)
    return EpisodeTrace(success, inputs, actions, achieved)


@pytest.mark.parametrize(
    ("b_inputs", "expected"),
    [
        ([[0.0], [1.0], [2.5]], 3e-7),  # inputs part at tick 2: its action gap (1.0) is the trajectories', not counted
        ([[0.0], [1.0], [2.0]], 1.0),  # inputs never part: every tick counts
        ([[0.5], [1.0], [2.0]], 0.0),  # even the first inputs differ: no tick to compare on
    ],
)
def test_the_action_gap_counts_only_the_leading_ticks_with_identical_inputs(b_inputs, expected):
    a = _trace([[0.0], [1.0], [2.0]], [[0.5], [0.5], [0.5]])
    b = _trace(b_inputs, [[0.5 + 1e-7], [0.5 - 3e-7], [-0.5]])
    assert same_input_action_gap(a, b) == pytest.approx(expected, abs=1e-12)


def test_compare_counts_flips_by_side_and_the_paired_difference():
    moved = np.array([[0.0, 0, 0], [0, 0, 1e-3]])
    a = [_trace([[0.0], [1.0]], [[0.0], [0.0]], won, moved if parts else None) for won, parts in
         [(True, True), (True, False), (False, False), (False, True), (True, False)]]  # fmt: skip
    b = [_trace([[0.0], [1.0]], [[2e-7], [0.0]], won) for won in (False, True, True, False, True)]
    pair = compare("x", "y", a, b, threshold=1e-4)
    assert (pair.flips, pair.a_only, pair.b_only, pair.episodes) == (2, 1, 1, 5)
    assert pair.rate_difference == 0.0 and pair.paired_se == pytest.approx(math.sqrt(0.5) / math.sqrt(5))
    assert pair.divergence_ticks == (1, None, None, 1, None) and pair.diverged == 2
    assert pair.median_divergence_tick is None  # 3 of 5 never part
    assert pair.first_action_gap == pytest.approx(2e-7)
    with pytest.raises(ValueError, match="x ran 5 episodes and y 4"):
        compare("x", "y", a, b[:4], threshold=1e-4)


def _report(again_won=(True, False), again_ticks=(None, None)) -> AgreementReport:
    setting = AgreementSetting("FetchReach-v4", 120.0, 1, 2, 0, True, 1e-7, 1e-4)
    torch_won = (True, False)
    pairs = [
        PairFigures(ONNX, TORCH, (False, False), torch_won, 1e-7, (5, 9)),
        PairFigures(TORCH_AGAIN, TORCH, again_won, torch_won, 0.0, again_ticks),
    ]
    return AgreementReport(setting, {ONNX: (False, False), TORCH: torch_won, TORCH_AGAIN: again_won}, pairs)


def test_the_report_reads_determinism_from_torch_run_again_and_writes_plain_json():
    report = _report()
    assert report.deterministic is True and report.pair(ONNX, TORCH) is not None and report.pair(INT8, ONNX) is None
    text = report.summary()
    assert "success    onnx 0/2, torch 1/2, torch-again 1/2" in text and "WARNING" not in text
    assert "onnx vs torch" in text and "flips   1 (0 onnx only, 1 torch only)" in text and "median tick 7" in text
    written = json.loads(json.dumps(report.to_dict()))
    assert written["pairs"][0]["flips"] == 1 and written["pairs"][0]["rate_difference"] == -0.5
    assert written["outcomes"]["torch"] == [True, False] and written["setting"]["epsilon"] == 1e-7
    assert _report(again_ticks=(None, 3)).deterministic is False
    assert "not deterministic" in _report(again_won=(False, False)).summary()


def test_torch_plus_eps_moves_every_action_by_epsilon_with_signs_fixed_by_the_seed():
    from deploy_npu.agreement_run import perturbed

    def base(x):
        return np.full(4, 0.25, np.float32)

    moved = perturbed(base, 1e-7, 4, seed=0)
    x = np.zeros(13, np.float32)
    gap = moved(x) - 0.25
    assert np.allclose(np.abs(gap), 1e-7, rtol=0, atol=1e-15) and np.array_equal(moved(x), moved(x))
    assert np.array_equal(perturbed(base, 1e-7, 4, seed=0)(x), moved(x))
    assert not all(np.array_equal(perturbed(base, 1e-7, 4, seed=s)(x), moved(x)) for s in range(1, 4))


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ({"episodes": 0}, "episodes"),
        ({"hz": 0.0}, "hz"),
        ({"delay_ms": -1.0}, "delay_ms"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"divergence_threshold": -1e-4}, "divergence_threshold"),
    ],
)
def test_agreement_refuses_a_setting_whose_figures_would_mean_nothing(tmp_path, option, field):
    from deploy_npu.agreement_run import agreement

    with pytest.raises(ConfigError, match=rf"^{field} \(") as caught:
        agreement(tmp_path / "no-run", **option)
    assert caught.value.field == field


def _reach_controllers(tmp_path):
    """The ONNX P-controller of test_envelope.py and the same gain as a torch module."""
    import torch

    from deploy_npu.parity import OnnxPolicy
    from tests.test_envelope import _reach_controller

    graph = OnnxPolicy(_reach_controller(tmp_path / "reach.onnx"))
    gain = torch.zeros(13, 4)
    for i in range(3):
        gain[i, i], gain[10 + i, i] = -10.0, 10.0

    def torch_policy(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.clamp(torch.from_numpy(x) @ gain, -1.0, 1.0).numpy()

    return (lambda x: graph.run_batch(x[None])[0]), torch_policy


def test_controllers_of_one_policy_on_the_same_reach_episodes_agree_as_the_figures_say(tmp_path):
    from deploy_npu.agreement_run import agree, perturbed
    from deploy_npu.parity import drive
    from foundation.config import RandomizationConfig
    from sim.registry import get_task

    onnx, torch_policy = _reach_controllers(tmp_path)
    controllers = {ONNX: onnx, TORCH: torch_policy, TORCH_AGAIN: torch_policy}
    controllers[TORCH_EPS] = perturbed(torch_policy, 1e-7, 4, seed=0)
    setting = AgreementSetting("FetchReach-v4", 60.0, 1, 3, 0, True, 1e-7, 1e-4)
    lines: list[str] = []
    report = agree(controllers, setting, RandomizationConfig(), progress=lines.append)
    assert list(report.outcomes) == [ONNX, TORCH, TORCH_AGAIN, TORCH_EPS] and len(lines) == 4
    assert [(p.a, p.b) for p in report.pairs] == [pair for pair in PAIRS if INT8 not in pair]
    assert report.deterministic is True
    again = report.pair(TORCH_AGAIN, TORCH)
    assert again is not None and again.divergence_ticks == (None, None, None) and again.first_action_gap == 0.0
    eps = report.pair(TORCH_EPS, TORCH)
    assert eps is not None and eps.first_action_gap == pytest.approx(1e-7, abs=1e-12)
    exported = report.pair(ONNX, TORCH)
    assert exported is not None and exported.first_action_gap < 1e-5  # float32 MatMul in two libraries
    for pair in report.pairs:
        assert pair.episodes == 3 and 0 <= pair.flips <= 3 and len(pair.divergence_ticks) == 3
        assert all(t is None or 0 <= t < 120 for t in pair.divergence_ticks)  # 2 s at 60 Hz
    assert sum(report.outcomes[TORCH]) >= 2  # the controller reaches: the agreement is not of failures
    # The recorder changes nothing: deploy-check's own drive counts what the traces say.
    won, _ = drive(onnx, get_task("FetchReach-v4"), 60.0, RandomizationConfig(), episodes=3, delay_ticks=1, seed=0)
    assert won == sum(report.outcomes[ONNX])


def test_a_runs_controllers_int8_included_are_checked_on_the_same_episodes(tmp_path):
    from deploy_npu.agreement_run import agreement
    from tests.test_controller import _run_dir

    run_dir = _run_dir(tmp_path / "run", 'model.kind="dense"', "learner.hidden_sizes=[16]")
    lines: list[str] = []
    report = agreement(
        run_dir, hz=25.0, delay_ms=0.0, episodes=2, int8=True, graphs_dir=tmp_path / "graphs", progress=lines.append
    )
    assert list(report.outcomes) == [ONNX, TORCH, TORCH_AGAIN, TORCH_EPS, INT8]
    assert [(p.a, p.b) for p in report.pairs] == list(PAIRS) and report.deterministic is True
    assert (report.setting.task, report.setting.delay_ticks, report.setting.randomized) == ("FetchReach-v4", 0, True)
    assert sorted(p.name for p in (tmp_path / "graphs").glob("*.onnx")) == [
        "FetchReach-v4-25hz.int8.onnx",
        "FetchReach-v4-25hz.onnx",
    ]
    exported = report.pair(ONNX, TORCH)
    assert exported is not None and exported.first_action_gap < 1e-5  # the parity check's tolerance
    assert all(len(won) == 2 for won in report.outcomes.values()) and len(lines) == 5
