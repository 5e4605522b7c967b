"""A rollout whose samples are NaN or inf is reported with what became non-finite first (the network's weights, its
arithmetic on finite inputs, or the states after a named step), so the advice fits the cause
(flowgrpo/engine/rollout.py nonfinite_cause)."""

from types import SimpleNamespace

import torch

import samplers
from flowgrpo.engine.rollout import nonfinite_cause


def _rollout(velocity, plan):
    return samplers.rollout(velocity, plan, prompt_ids=[0, 1], latent_shape=(2, 3, 3), seed=0)


def test_the_first_non_finite_step_is_named_with_its_kernel_and_eta():
    plan = samplers.compose_plan(6, eta=0.7, group_size=2)

    def velocity(x, sigma, cond_index):  # finite until σ drops below 0.5, then inf
        return torch.where((sigma < 0.5).view(-1, 1, 1, 1), torch.full_like(x, float("inf")), -x)

    record = _rollout(velocity, plan)
    assert not bool(torch.isfinite(record.leaf_state).all())
    first = min(i for i in range(6) if float(plan.sigmas[i]) < 0.5)
    cause = nonfinite_cause(record, plan, velocity, SimpleNamespace(dtype=torch.float32))
    assert f"after step {first} (σ {float(plan.sigmas[first]):.4g}" in cause and "flow_sde, η=0.7" in cause
    assert "lower sampling.plan.eta" in cause


def test_a_network_with_nan_weights_is_named_as_diverged_training():
    net = torch.nn.Linear(3, 3)
    plan = samplers.compose_plan(4, eta=0.7, group_size=2)

    def velocity(x, sigma, cond_index):
        return net(x)

    record = _rollout(velocity, plan)
    with torch.no_grad():
        net.weight[0, 0] = float("nan")
    cause = nonfinite_cause(record, plan, velocity, SimpleNamespace(dtype=torch.float32, transformer=net))
    assert cause.startswith("the network's weights hold NaN or inf (1 tensors, e.g. weight): training diverged; lower "
                            "train.learning_rate")
    # finite weights and a velocity that overflows anyway: the arithmetic, not the learning rate, comes first
    with torch.no_grad():
        net.weight[0, 0] = 0.0
    cause = nonfinite_cause(record, plan, lambda x, s, c: net(x) * float("inf"),
                            SimpleNamespace(dtype=torch.float16, transformer=net))
    assert "on finite inputs and weights: its arithmetic overflows in torch.float16" in cause
