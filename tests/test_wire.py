"""foundation.wire: tensors on the wire, bfloat16 gradients included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foundation.wire import (
    WIRE_DTYPES,
    Transitions,
    TransitionSchema,
    WireError,
    batch_from_proto,
    batch_to_proto,
    bfloat16_bits,
    from_tensor,
    to_tensor,
)


def test_bfloat16_rounds_to_nearest_even_as_torch_does():
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-8, 4, 10_000),
        np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.4e38, -1e-40], np.float32),  # ties, huge, subnormal
    ]).astype(np.float32)  # fmt: skip
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bfloat16_bits(values), expected)
    back = from_tensor(to_tensor("g", values[:10_000].reshape(100, 100), "bfloat16"), allowed=WIRE_DTYPES)
    assert back.dtype == np.float32 and back.shape == (100, 100)
    back = from_tensor(to_tensor("g", values, "bfloat16"), allowed=WIRE_DTYPES)
    np.testing.assert_array_equal(back.ravel(), torch.from_numpy(values).to(torch.bfloat16).float().numpy())


def test_only_gradients_may_come_as_bfloat16():
    tensor = to_tensor("obs", np.ones((2, 3), np.float32), "bfloat16")
    with pytest.raises(WireError, match=r"columns\[obs\]\.dtype: 'bfloat16' is not one of \('float32',\)"):
        from_tensor(tensor, "columns")
    schema = TransitionSchema(obs_dim=3, goal_dim=1, act_dim=1)
    n = 2
    rows = Transitions(
        obs=np.ones((n, 3)), goal=np.ones((n, 1)), action=np.zeros((n, 1)), reward=np.zeros(n),
        next_obs=np.ones((n, 3)), done=np.zeros(n),
    )  # fmt: skip
    batch = batch_to_proto(rows, run_id="r", sampler_id=1, seq=1, policy_version=0, task_id=0, env_steps=n)
    batch.columns[0].CopyFrom(to_tensor("obs", np.ones((n, 3), np.float32), "bfloat16"))
    with pytest.raises(WireError, match=r"columns\[obs\]\.dtype"):
        batch_from_proto(batch, schema)
