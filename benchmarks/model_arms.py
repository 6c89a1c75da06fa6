"""The models `learner_throughput.py --model` measures: each arm's config on the 4-task set.

from model_arms import MODEL_ARMS, arm_config, model_ratios
config = arm_config("moe-e32")       # as `fleetrl train --tasks ... --set model.kind="moe"` builds it
model_ratios({"moe-e32": 40.0, "moe-e8": 48.0})   # {"moe-e32 / moe-e8": 0.833}
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.cli.presets import preset_for
from foundation.config import RunConfig, tasks_overrides, with_overrides

# --model arms: overrides on the multi-task config (4 tasks, batch 256, one torch thread).
MODEL_ARMS: dict[str, list[str]] = {
    "dense": ['model.kind="dense"'],  # learner.hidden_sizes [256, 256]
    "moe-e8": ['model.kind="moe"', "model.experts=8"],  # top-2, expert width 128, task router
    "moe-e32": ['model.kind="moe"', "model.experts=32"],  # the default MoE: active width 2 x 128
    "moe-e32-w256": ['model.kind="moe"', "model.experts=32", "model.expert_width=256"],  # 2x the active width
    # per task, k mixed experts are ONE Linear of expert_width (sum_j g_j W_j): 256 is the
    # dense default's width per task; 8 or 16 experts keep the flat vector near moe-e32's
    "moe-e8-w256": ['model.kind="moe"', "model.experts=8", "model.expert_width=256"],
    "moe-e16-w256": ['model.kind="moe"', "model.experts=16", "model.expert_width=256"],
    "moe-e8-state": ['model.kind="moe"', "model.experts=8", 'model.router="state"'],
    "moe-e32-state": ['model.kind="moe"', "model.experts=32", 'model.router="state"'],
    "dense-bf16": ['model.kind="dense"', 'learner.autocast="bf16"'],  # the CPU's BF16 instructions
    "dense-compile": ['model.kind="dense"', "learner.compile=true"],  # torch.compile (inductor)
    # TQC (sb3-contrib's, rl-zoo's choice for Fetch): two critics of 25 quantiles, 2 dropped each
    "dense-tqc": ['model.kind="dense"', 'learner.algo="tqc"'],
    # CrossQ (no target critics; batch-renormalized critics on the current and next halves at once)
    "dense-crossq": ['model.kind="dense"', 'learner.algo="crossq"'],
    "moe-e32-bf16": ['model.kind="moe"', "model.experts=32", 'learner.autocast="bf16"'],
    # the MoE's twin critics one after the other (learner.fused_critics false)
    "moe-e32-unfused": ['model.kind="moe"', "model.experts=32", "learner.fused_critics=false"],
    # each pass of the update mixing the experts anew (learner.mix_once false)
    "moe-e32-mixeach": ['model.kind="moe"', "model.experts=32", "learner.mix_once=false"],
    # twice the rows per update: a cost mostly per op (the MoE's) grows less than the rows do
    "dense-b512": ['model.kind="dense"', "learner.batch_size=512"],
    # about the task-routed MoE recipe's actor parameters on MT10 (741k against 744k)
    "dense-w832": ['model.kind="dense"', "learner.hidden_sizes=[832, 832]"],
    "moe-e32-b512": ['model.kind="moe"', "model.experts=32", "learner.batch_size=512"],
}
# The per-model yardstick is top-2 (k = 2) with no shared expert: every MoE arm sets it, since a
# multi-task run of a task-routed MoE otherwise takes the recipe's top_k 3 with one shared
# expert (fleet/cli/presets.py TASK_ROUTED_SHARED), measured by its own arm.
MODEL_ARMS = {
    arm: [*sets, "model.top_k=2", "model.shared_experts=0"] if arm.startswith("moe") else sets
    for arm, sets in MODEL_ARMS.items()
}
MODEL_ARMS["moe-e32-shared"] = ['model.kind="moe"', "model.experts=32"]  # the recipe: top_k 3, 1 shared
MODEL_TASKS = ["FetchReach-v4", "FetchPush-v4", "MetaWorld-reach-v3", "MetaWorld-push-v3"]
# every arm at batch 256 in float32 unless it says otherwise, whatever the multi-task recipe's
# (a dense or task-routed MoE multi-task run's is batch 1024 with autocast "auto": MULTITASK_BATCH)
MODEL_BASE = ["learner.batch_size=256", 'learner.autocast="off"']


def arm_config(arm: str, extra: list[str] | None = None, tasks: Sequence[str] = MODEL_TASKS) -> RunConfig:
    """`arm`'s config on `tasks` (the 4-task set unless named) as the CLI builds a run's
    (fleet/cli/main.py): the preset and multi-task recipe chosen by what was set, then what was set
    on top (batch 256 in float32 unless the arm or `extra` sets them: MODEL_BASE); one torch thread."""
    overrides = [*tasks_overrides(list(tasks)), *MODEL_BASE, *MODEL_ARMS[arm], *(extra or [])]
    overrides.append("learner.torch_threads=1")
    return with_overrides(preset_for(with_overrides(RunConfig(), overrides), overrides), overrides).validate()


# --model ratios: (name, numerator arm, denominator arm, rows factor: 2 for batch 512 over 256)
MODEL_RATIOS = [
    ("moe-e32 / moe-e8", "moe-e32", "moe-e8", 1),  # goal >= 0.8
    ("moe-e32 / dense (equal active width)", "moe-e32", "dense", 1),  # goal >= 0.67
    ("dense-tqc / dense", "dense-tqc", "dense", 1),
    ("moe-e32-w256 / dense (twice the active width)", "moe-e32-w256", "dense", 1),
    ("dense-b512 / dense (rows)", "dense-b512", "dense", 2),  # rows learned per CPU-second
    ("moe-e32-b512 / moe-e32 (rows)", "moe-e32-b512", "moe-e32", 2),
    ("moe-e32-b512 / dense (rows)", "moe-e32-b512", "dense", 2),
    ("moe-e32-shared / dense (the multi-task recipe's MoE)", "moe-e32-shared", "dense", 1),
    ("dense-w832 / dense (the MoE's parameter count)", "dense-w832", "dense", 1),
]


def model_ratios(medians: dict[str, float]) -> dict[str, float]:
    """The MODEL_RATIOS whose two arms were measured, on the gradients-alone medians."""
    return {
        name: round(factor * medians[num] / medians[den], 3)
        for name, num, den, factor in MODEL_RATIOS
        if num in medians and medians.get(den)
    }
