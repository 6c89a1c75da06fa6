"""Every algorithm behind learner.Algorithm, from its config name to one update's gradients: the
same contract run over each (learner/algos/, foundation/config_algos.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.config_algos import ALGOS
from foundation.policy import model_spec
from learner.algos import ALGORITHMS, build_algorithm
from learner.algos.tqc import TQC
from learner.gradients import Hyperparams, compute_gradients
from nets.models import GRADIENT_GROUPS, GROUPS, SACModel
from sim.registry import get_task
from tests.test_sac import _batch


def test_the_registry_holds_the_names_the_config_accepts():
    assert tuple(ALGORITHMS) == ALGOS


def test_an_algorithm_is_built_with_its_own_section():
    config = with_overrides(RunConfig(), ['learner.algo="tqc"', "learner.tqc.drop=3"]).validate()
    assert build_algorithm(config.learner) == TQC(drop=3)
    with pytest.raises(ConfigError, match=r"learner.algo \('ddpg'\) must be one of sac, tqc, crossq"):
        build_algorithm(with_overrides(RunConfig(), ['learner.algo="ddpg"']).learner)


@pytest.mark.parametrize("name", ALGOS)
def test_each_algorithm_fills_every_gradient_group_and_changes_no_weight(name):
    overrides = [f'learner.algo="{name}"', "learner.hidden_sizes=[32, 32]", "learner.tqc.quantiles=5"]
    config = with_overrides(RunConfig(), overrides).validate()
    task = get_task("FetchReach-v4")
    spec = model_spec(config, task)  # the critics the algorithm's section asks for
    assert (spec.critic_quantiles, spec.critic_renorm) == tuple(config.learner.algorithm().critics())
    torch.manual_seed(0)
    model = SACModel(spec, init_log_alpha=-1.0)
    before = {g: model.get_flat(g) for g in GROUPS}
    result = compute_gradients(model, _batch(64, spec=spec), Hyperparams.for_run(config, task.act_dim))
    sizes = model.group_sizes()
    assert set(result.grads) == set(GRADIENT_GROUPS)
    for group, grad in result.grads.items():
        assert grad.shape == (sizes[group],) and np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, group
    for group, weights in before.items():
        np.testing.assert_array_equal(model.get_flat(group), weights, err_msg=group)
    for key in ("loss/critic", "loss/actor", "loss/alpha"):
        assert np.isfinite(result.metrics[key]), key
