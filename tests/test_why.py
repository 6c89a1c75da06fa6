"""`fleetrl evaluate --why` on the real simulator: scripted behaviours get their class (the
thresholds of sim/failures.py hold in MuJoCo), the recorded episodes are the evaluator's, and
the command writes its table, JSON and plot for an untrained checkpoint."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from fleet.cli.main import main
from foundation.acting import rollout
from foundation.config import RunConfig, tasks_overrides, with_overrides
from sim.failure_trace import FetchProbe, record_episode
from sim.failures import CLASSIFIERS, SUCCESS, Verdict
from sim.registry import make_env

SEED = 1_000_000  # seeds 1_000_000..1_000_002 put PickAndPlace's goal on the table, 1_000_003 in the air
AIR = SEED + 3


class Script:
    """A scripted Fetch gripper: `kind` says what it does with the object."""

    def __init__(self, kind: str) -> None:
        self.kind, self.step = kind, 0

    def new_episode(self) -> None:
        self.step = 0

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        grip, obj, goal = obs["observation"][0:3], obs["observation"][3:6], obs["desired_goal"]
        t, self.step = self.step, self.step + 1

        def toward(point: np.ndarray, fingers: float) -> np.ndarray:
            return np.array([*np.clip((point - grip) * 15, -1, 1), fingers], np.float32)

        if self.kind == "still":
            return np.zeros(4, np.float32)
        if self.kind == "push":  # fingers shut: from behind the object, along the table toward the goal
            way = (goal[:2] - obj[:2]) / (np.linalg.norm(goal[:2] - obj[:2]) + 1e-9)
            behind = np.r_[obj[:2] - 0.06 * way, obj[2]]
            return toward(behind + (0, 0, 0.05 if t < 10 else 0), -1) if t < 16 else toward(np.r_[goal[:2], obj[2]], -1)
        aim = obj + (0.045, 0, 0) if self.kind == "close_beside" else obj  # beside: no finger on the block
        if t < 20:  # open above it, then down around it
            return toward(aim + (0, 0, 0.05 if t < 12 else 0), 1)
        if t < 25 or self.kind == "close_beside":
            return toward(aim, -1) if self.kind == "close_beside" else np.array([0, 0, 0, -1], np.float32)
        if self.kind == "drop":  # up, then open 15 cm over the table
            return np.array([0, 0, 1, -1] if t < 30 else [0, 0, 0, 1], np.float32)
        return toward(goal, -1)  # carry


CASES = [  # (task, behaviour, seed, class)
    ("FetchPickAndPlace-v4", "still", SEED, "never_reached"),
    ("FetchPickAndPlace-v4", "carry", AIR, SUCCESS),
    ("FetchPickAndPlace-v4", "drop", AIR, "dropped"),
    ("FetchPickAndPlace-v4", "close_beside", SEED, "closed_off_object"),
    ("FetchPickAndPlace-v4", "push", AIR, "pushed_not_lifted"),
    ("FetchPush-v4", "still", SEED, "never_reached"),
    ("FetchSlide-v4", "still", SEED, "never_hit"),
]


def test_scripted_behaviours_in_mujoco_get_their_class():
    envs = {task: make_env(task) for task in {case[0] for case in CASES}}
    try:
        got = []
        for task, kind, seed, _ in CASES:
            trace = record_episode(envs[task], FetchProbe(envs[task]), Script(kind), seed=seed)
            got.append((task, kind, seed, CLASSIFIERS[task].classify(trace)))
    finally:
        for env in envs.values():
            env.close()
    assert got == CASES


def test_the_recorded_success_is_what_the_evaluator_counts():
    env = make_env("FetchPickAndPlace-v4")
    try:
        probe, seeds = FetchProbe(env), range(SEED, SEED + 4)
        traced = [record_episode(env, probe, Script("carry"), seed=s) for s in seeds]
        scored = [rollout(env, Script("carry"), s, np.random.default_rng(s), deterministic=True)[1] for s in seeds]
    finally:
        env.close()
    assert [t.success for t in traced] == scored and any(scored)
    assert all(len(t.states.obj) == 51 for t in traced)  # after reset and after each of the 50 steps
    goal_in_air = [Verdict.of(t, "x").goal_in_air for t in traced]
    assert goal_in_air == [False, False, False, True]


def _run_dir(root: pathlib.Path, tasks: list[str]) -> pathlib.Path:
    """A run directory with an untrained checkpoint of `tasks` (no training)."""
    from aggregator.core import AggregatorCore
    from foundation.checkpoint import save_checkpoint
    from foundation.policy import model_spec
    from sim.tasks import TaskSet

    sets = [f'sim.task="{tasks[0]}"'] if len(tasks) == 1 else tasks_overrides(tasks)
    config = with_overrides(RunConfig(), [*sets, "learner.hidden_sizes=[16]"])
    root.mkdir(parents=True)
    (root / "config.json").write_text(config.to_json())
    task_set = TaskSet.of(tasks)
    core = AggregatorCore(model_spec(config, task_set), config.aggregator, 1, 1, task_set.label)
    save_checkpoint(root / "checkpoints", core.state(), keep=1)
    return root


def test_evaluate_why_writes_the_table_its_json_and_a_plot(tmp_path, capsys):
    from sampler.evaluator import score_checkpoint

    run_dir = _run_dir(tmp_path / "run", ["FetchPickAndPlace-v4"])
    assert main(["evaluate", str(run_dir), "--why", "--episodes", "4", "--first-seed", str(SEED)]) == 0
    out = capsys.readouterr().out
    assert "goal in air" in out and "goal on table" in out and "closed_off_object" in out
    doc = json.loads((run_dir / "why" / "ckpt_0000000000.json").read_text())
    assert (run_dir / "why" / "ckpt_0000000000.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pnp = doc["tasks"]["FetchPickAndPlace-v4"]
    assert [e["seed"] for e in pnp["episodes"]] == list(range(SEED, SEED + 4))
    assert [e["goal_in_air"] for e in pnp["episodes"]] == [False, False, False, True]
    assert {e["label"] for e in pnp["episodes"]} <= set(pnp["classes"])
    assert sum(row["all"] for row in pnp["classes"].values()) == 4
    config = RunConfig.load(str(run_dir / "config.json"))
    config = with_overrides(config, [f"eval.seed={SEED}"])
    _, scored = score_checkpoint(run_dir / "checkpoints", config, 4)
    assert pnp["success_rate"] == scored.success_rate  # the same episodes as `fleetrl evaluate`
    elsewhere = tmp_path / "elsewhere"
    assert main(["evaluate", str(run_dir), "--why", "--episodes", "1", "--json", "--out", str(elsewhere)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((elsewhere / "ckpt_0000000000.json").read_text())
    assert printed["episodes"] == 1 and pathlib.Path(printed["tasks"]["FetchPickAndPlace-v4"]["plot"]).exists()


def test_a_task_without_a_classifier_is_refused_alone_and_skipped_beside_one(tmp_path, capsys):
    reach = _run_dir(tmp_path / "reach", ["FetchReach-v4"])
    assert main(["evaluate", str(reach), "--why", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetrl evaluate: error: --why has no classifier for FetchReach-v4; it classifies ")
    assert "FetchPickAndPlace-v4" in err and "Traceback" not in err and not (reach / "why").exists()
    three = _run_dir(tmp_path / "three", ["FetchReach-v4", "FetchPush-v4", "FetchSlide-v4"])
    assert main(["evaluate", str(three), "--why", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "FetchPush-v4: ckpt_0000000000.pt" in out and "FetchSlide-v4: ckpt_0000000000.pt" in out
    assert "skipped: --why has no classifier for FetchReach-v4" in out
    doc = json.loads((three / "why" / "ckpt_0000000000.json").read_text())
    assert list(doc["tasks"]) == ["FetchPush-v4", "FetchSlide-v4"] and list(doc["skipped"]) == ["FetchReach-v4"]
    for task in doc["tasks"]:  # several tasks classified: a plot each
        assert doc["tasks"][task]["plot"] == str(three / "why" / f"ckpt_0000000000_{task}.png")
        assert pathlib.Path(doc["tasks"][task]["plot"]).exists()
