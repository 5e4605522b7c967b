"""The wiring around the forward-process learners' losses (docs/math.md §5; flowgrpo/engine/learners/forward.py,
nft.py, awm.py, dgpo.py; the weight copies of flowgrpo/engine/policy.py and copies.py).

tests/engine/test_forward_learners.py pins the loss formulas on their own; these tests pin what feeds them and
what is done with their value inside ``ForwardLearner.update``: the scale of AWM's policy term against its KL
terms, the KL terms' sign and coefficients, which copy of the weights serves as θ_old / EMA / ema_ref (and how the
copies follow the weights), DGPO's per-(group, draw) comparison, and the normaliser of an optimizer step.

**The hand world.** The analytic trainer (configs/analytic.yaml) with its model's velocity replaced by the trainable
residual network alone, whose output layer has zero weight: then every set of weights has the *constant* velocity
v = b (its output bias) exactly, in floats too, and the reference (the frozen zero network) has v_ref = 0. So θ,
each copy and the reference get velocities chosen by hand (``set_velocity``), and with hand-made leaves, advantages
and training draws (t, ε) every loss and gradient below is hand arithmetic (in the comments) or, for DGPO's
group objective, a float64 transcription of docs/math.md §5. Updates run with learning rate 0, so a step leaves θ
where it was; the step's gradient stays in ``p.grad`` (gradient clipping off).

Each test's docstring names the injected error it was checked to catch (by mutating a copy of the source).
Run: pytest tests/engine/test_wiring.py -q
"""

import math
from types import SimpleNamespace

import pytest
import torch

from flowgrpo.engine.credit import Advantages
from flowgrpo.engine.learners import Rollouts
from train_fixtures import analytic_trainer
from tolerance import assert_close_ulps

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

LN2 = math.log(2.0)


# ------------------------------------------------------------------------------------------------
# the hand world
# ------------------------------------------------------------------------------------------------
def hand_trainer(tmp_path, preset, *extra):
    """An analytic-world trainer whose velocity is the residual network's output alone (see the module docstring)."""
    trainer = analytic_trainer(tmp_path, preset, "train.learning_rate=0.0", "train.grad_clip=0.0", "eval.every=0",
                               "log.samples_every=0", "log.gallery=false", *extra)
    model = trainer.model
    model._transformer_velocity = lambda net, x, sigma, cond, scale: net(x, sigma, cond.pooled_prompt_embeds)
    return trainer


def _out_layer(trainer):
    """Indices of the output layer's weight and bias in policy.params (and in every copy's values)."""
    out, params = trainer.model.transformer.out, trainer.policy.params
    return (next(i for i, p in enumerate(params) if p is out.weight),
            next(i for i, p in enumerate(params) if p is out.bias))


def set_velocity(trainer, tensors, b):
    """Make ``tensors`` (policy.params or a copy's values) the weights of the constant velocity v = b."""
    iw, ib = _out_layer(trainer)
    with torch.no_grad():
        tensors[iw].zero_()
        tensors[ib].copy_(torch.tensor(b, dtype=tensors[ib].dtype))


def bias_grad(trainer):
    """The gradient of the last optimizer step's loss with respect to b (v_θ = b, so it is Σ_rows ∂L/∂v)."""
    return trainer.policy.params[_out_layer(trainer)[1]].grad


def hand_rollouts(trainer, leaves):
    """One rollout batch of hand-made leaves, and the learner's training draws replaced by the leaves' own.

    ``leaves``: (prompt, local group, x0 [2], advantage, t [K], ε [K, 2]) each; prompt p is slot p, "mode p". The
    draws are looked up by leaf; the key each leaf was drawn with is recorded in ``trainer.learner.keys_seen``."""
    model, learner = trainer.model, trainer.learner
    prompts = 1 + max(leaf[0] for leaf in leaves)
    gpp = 1 + max(leaf[1] for leaf in leaves)
    record = SimpleNamespace(
        num_leaves=len(leaves),
        leaf_state=torch.tensor([leaf[2] for leaf in leaves], dtype=torch.float32),
        leaf_prompt=torch.tensor([leaf[0] for leaf in leaves]),
        leaf_group=torch.tensor([leaf[0] * gpp + leaf[1] for leaf in leaves]),
        leaf_node=torch.arange(len(leaves)) + 10,
        prompt_cond=torch.arange(prompts),
        groups_per_prompt=gpp,
    )
    # samplers.Trajectory.latents: these latents are stored as the learner uses them
    record.latents = lambda name, rows=None: getattr(record, name) if rows is None else getattr(record, name)[rows]
    batch = SimpleNamespace(record=record, slots=list(range(prompts)),
                            cond=model.encode_prompts([f"mode {p}" for p in range(prompts)]))
    advantages = Advantages([], [torch.tensor([leaf[3] for leaf in leaves], dtype=torch.float64)])
    learner.keys_seen = {}

    def draws(sample, epoch, space):
        learner.keys_seen[sample.leaf] = sample.key
        t, eps = leaves[sample.leaf][4], leaves[sample.leaf][5]
        return torch.tensor(t, dtype=torch.float32), torch.tensor(eps, dtype=torch.float32)

    learner.draws = draws
    plan = SimpleNamespace(sigmas=torch.linspace(1.0, 0.0, 11, dtype=torch.float64), shift=3.0, unedited_sigmas=None)
    return Rollouts(0, plan, [batch], advantages)


# ------------------------------------------------------------------------------------------------
# 1. AWM: the policy term A/A_max against the two KL terms
# ------------------------------------------------------------------------------------------------
def test_awm_policy_term_is_scaled_by_adv_max_against_both_kl_terms(tmp_path):
    """AWM trains ppo_clip(ρ, A/A_max, ε) + kl·mean_D(v_θ − v_ref)² + kl_ema·mean_D(v_θ − v_ema)² (docs/math.md §5):
    the advantage is divided by A_max = 5 before the clip, the KL terms are not. Pinned on the loss and on its
    gradient, with ℓ_old, the reference and the EMA each on its own weights.
    Catches: dropping ``/ lc.adv_max`` in AWMLearner.micro_loss (the policy term 5x against the KL terms)."""
    trainer = hand_trainer(tmp_path, "awm", "learner.train_times=2", "learner.awm.weighting=uniform",
                           "learner.kl_coef=0.5", "learner.awm.ema_kl_coef=0.25")
    learner, policy = trainer.learner, trainer.policy
    set_velocity(trainer, policy.params, [1.0, -1.0])  # v_θ = b = [1, −1]; ℓ_old is θ's (begin_update): ρ = 1
    set_velocity(trainer, learner.ema.values, [0.0, 1.0])  # v_ema = [0, 1]; v_ref = 0
    # one group of two samples, x0 = 0 so u = ε: A = 2.5 → a = A/A_max = 0.5, A = −5 → a = −1
    leaves = [(0, 0, [0.0, 0.0], 2.5, [0.5, 0.25], [[0.0, 0.0], [1.0, -1.0]]),
              (0, 0, [0.0, 0.0], -5.0, [0.5, 0.25], [[1.0, 1.0], [-1.0, -1.0]])]
    metrics = learner.update(hand_rollouts(trainer, leaves))
    # per row at ρ = 1: −a + 0.5·mean(b²) + 0.25·mean((b − v_ema)²) = −a + 0.5·1 + 0.25·mean(1, 4) = −a + 1.125
    # mean over the 4 rows: −(0.5 + 0.5 − 1 − 1)/4 + 1.125 = 0.25 + 1.125 = 1.375   (without ÷A_max: 2.375)
    assert_close_ulps(torch.tensor(metrics["loss"]), torch.tensor(1.375), ulps=8, dtype=torch.float32)
    # ∂/∂v per row (D = 2, ℓ = −mean_D(v − u)²): a·(b − u) + 0.5·b + 0.25·(b − v_ema)
    #   Σ_rows a·(b − u) = 0.5·([1, −1] + [0, 0]) − 1·([0, −2] + [2, 0]) = [−1.5, 1.5]
    #   gradient = [−1.5, 1.5]/4 + [0.5, −0.5] + [0.25, −0.5] = [0.375, −0.625]   (without ÷A_max: [−1.125, 0.875])
    assert_close_ulps(bias_grad(trainer), torch.tensor([0.375, -0.625]), ulps=8)
    assert metrics["max_abs_ratio_minus_1_epoch0"] == 0.0


# ------------------------------------------------------------------------------------------------
# 2. the KL terms: sign and coefficients, every forward learner
# ------------------------------------------------------------------------------------------------
B = [0.5, -1.5]  # v_θ − v_ref = b: mean_D(b²) = (0.25 + 2.25)/2 = 1.25
B_EMA = [1.5, 0.5]  # AWM's EMA: mean_D((b − v_ema)²) = mean(1, 4) = 2.5


@pytest.mark.parametrize("preset, coefficients", [
    ("diffusion_nft", [(1e-2, 0.0), (2e-2, 0.0)]),
    ("awm", [(0.5, 0.25), (1.0, 0.25), (0.5, 0.5)]),
    ("dgpo", [(0.02, 0.0), (0.04, 0.0)]),
])
def test_kl_terms_add_plus_kl_coef_times_the_mean_squared_velocity_gap(tmp_path, preset, coefficients):
    """With the policy term switched off (advantages 0; for NFT also v_θ = v_old = u, so x̂0± = x0 exactly) a step's
    loss is +kl·mean_D(v_θ − v_ref)² (+ kl_ema·mean_D(v_θ − v_ema)² in AWM) averaged over the rows, and its gradient
    (kl·(v_θ − v_ref) + kl_ema·(v_θ − v_ema))·2/D; doubling one coefficient doubles its term. DGPO's group objective
    adds its constant (G/β)·softplus(0) per (group, draw) = ln 2/β per row, with no gradient.
    Two micro-batches (one group each): a learner dividing by its micro-batch's rows instead of the step's doubles it.
    Catches: the KL's sign flipped or its coefficient dropped/scaled (kl_coef in NFT, AWM, DGPO; ema_kl_coef in AWM),
    the KL taken against the wrong weights (the EMA for the reference or the reference for the EMA), a learner's
    loss normalised per micro-batch."""
    trainer = hand_trainer(tmp_path, preset, "learner.train_times=2", "train.micro_batch=2")
    learner, policy, lc = trainer.learner, trainer.policy, trainer.cfg.learner
    # three samples in two groups (2 + 1), K = 2 draws each, ε = x0 + b so that u = ε − x0 = b = v_θ (dyadic: exact);
    # micro-batches of about 2 rows: each group is one (the logged loss sums them)
    x0s = [[0.5, -1.0], [0.25, 0.75], [-1.0, 2.0]]
    leaves = [(p, 0, x0, 0.0, [0.5, 0.25], [[x0[0] + B[0], x0[1] + B[1]]] * 2) for p, x0 in zip([0, 0, 1], x0s)]
    for kl, kl_ema in coefficients:
        lc.kl_coef, lc.awm.ema_kl_coef = kl, kl_ema
        set_velocity(trainer, policy.params, B)
        for copy in policy.copies.values():  # NFT's θ_old, DGPO's ema_ref: v_old = v_θ; AWM's EMA: its own velocity
            set_velocity(trainer, copy.values, B_EMA if copy.name == "awm_ema" else B)
        metrics = learner.update(hand_rollouts(trainer, leaves))
        constant = LN2 / lc.dgpo.beta if preset == "dgpo" else 0.0
        expected = constant + kl * 1.25 + kl_ema * 2.5
        assert_close_ulps(torch.tensor(metrics["loss"]), torch.tensor(expected), ulps=8, dtype=torch.float32,
                          msg=f"{preset} kl={kl} kl_ema={kl_ema}")
        # ∂/∂v = kl·2·b/D + kl_ema·2·(b − v_ema)/D with D = 2, the same on every row
        grad = kl * torch.tensor(B) + kl_ema * (torch.tensor(B) - torch.tensor(B_EMA))
        assert_close_ulps(bias_grad(trainer), grad, ulps=8, msg=f"{preset} kl={kl} kl_ema={kl_ema}")


# ------------------------------------------------------------------------------------------------
# 3. which weights the copies hold: NFT's θ_old, AWM's EMA and ℓ_old, DGPO's ema_ref
# ------------------------------------------------------------------------------------------------
def _lerp64(copy, source, keep):
    return [keep * c + (1.0 - keep) * s for c, s in zip(copy, source)]


@pytest.mark.parametrize("preset, attribute, section, follows", [
    ("diffusion_nft", "old", "learner.nft.old", "iteration"),
    ("awm", "ema", "learner.awm.ema", "iteration"),
    ("dgpo", "ema_ref", "learner.dgpo.ema_ref", "step"),
])
def test_soft_copies_follow_the_recorded_weights(tmp_path, preset, attribute, section, follows):
    """Two real iterations (sample, score, update: 2 optimizer steps each, then the end of the iteration) of the
    analytic world; θ is recorded after every optimizer step. The copy the learner trains with is, replayed in
    float64 from those records (docs/math.md §5, soft copies), with λ(n) = min(rate·n, max) and rate 0.25, max 0.6:
    NFT's θ_old and AWM's EMA: θ_c ← λ·θ_c + (1 − λ)·θ once per iteration, after it (n = steps so far: λ = 0.5, 0.6);
    DGPO's ema_ref: after every optimizer step (λ = 0.25, 0.5, 0.6, 0.6). Each starts as θ. AWM's ℓ_old weights
    are θ as it was before the iteration's first step, exactly. NFT rolls out with θ_old.
    Catches: a copy following at the wrong time (step vs iteration), a wrong λ (rate·(n − 1), max ignored, λ and
    1 − λ swapped), a copy not followed, following θ_old from another tensor, AWM's ℓ_old snapshotted late."""
    trainer = analytic_trainer(tmp_path, preset, "sampling.plan={group_size: 4}", "learner.train_times=2",
                               "learner.time_min=0.0", "train.updates_per_epoch=2", "eval.every=0",
                               "log.samples_every=0", "log.gallery=false", f"{section}.rate=0.25", f"{section}.max=0.6")
    learner, policy = trainer.learner, trainer.policy
    copy = getattr(learner, attribute)
    steps = []  # (n, θ after step n) for every optimizer step taken
    step = policy.step

    def recording_step(*args, **kwargs):
        out = step(*args, **kwargs)
        steps.append((policy.optimizer_steps, [p.detach().double().clone() for p in policy.params]))
        return out

    policy.step = recording_step
    keep = lambda n: min(0.25 * n, 0.6)  # noqa: E731
    expected = [p.detach().double().clone() for p in policy.params]  # every copy starts as θ
    assert all(torch.equal(c, p) for c, p in zip(copy.values, policy.params))
    for iteration in range(2):
        before = [p.detach().clone() for p in policy.params]
        done = len(steps)
        trainer.step(iteration)
        assert policy.optimizer_steps == 2 * (iteration + 1) and len(steps) == done + 2  # no step skipped
        if follows == "step":
            for n, theta in steps[done:]:
                expected = _lerp64(expected, theta, keep(n))
        else:
            n, theta = steps[-1]
            expected = _lerp64(expected, theta, keep(n))
        assert any(not torch.equal(c, p) for c, p in zip(copy.values, policy.params))  # the copy lags θ
        for i, (value, want) in enumerate(zip(copy.values, expected)):
            assert_close_ulps(value, want, ulps=16, dtype=torch.float32, msg=f"{attribute} tensor {i}, iteration {iteration}")
        if preset == "awm":  # ℓ_old: the weights that made this iteration's rollout, θ before its first step
            assert all(torch.equal(o, b) for o, b in zip(learner.old.values, before))
    if preset == "diffusion_nft":
        assert learner.sampling_copy is copy


# ------------------------------------------------------------------------------------------------
# 4. DGPO: one comparison per (group, draw), against ema_ref's clip
# ------------------------------------------------------------------------------------------------
def dgpo_expected(leaves, groups, b, c, beta, kl, K):
    """Loss and ∂/∂b of a DGPO step in the hand world (v_θ = b, v_ref = 0, v_old = ema_ref's c), float64, written
    from docs/math.md §5: per group g and draw k, S = (β/G)·Σ_i A_i·(e_θ,i − e_ref,i), loss (G/β)·softplus(S), e_θ,i
    detached where ρ = exp(e_old,i − e_θ,i) leaves 1 ± 0.01 on A_i's side; plus kl·mean_D(b²) per row; ÷ rows."""
    b64 = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    c64 = torch.tensor(c, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    rows = 0
    for members in groups:
        for k in range(K):
            s = torch.zeros((), dtype=torch.float64)
            for i in members:
                _, _, x0, adv, _, eps = leaves[i]
                u = torch.tensor(eps[k], dtype=torch.float64) - torch.tensor(x0, dtype=torch.float64)
                e, e_ref, e_old = ((u - b64) ** 2).mean(), (u**2).mean(), ((u - c64) ** 2).mean()
                ratio = math.exp(float(e_old - e.detach()))
                if (adv > 0 and ratio > 1.01) or (adv < 0 and ratio < 0.99):
                    e = e.detach()
                s = s + adv * (e - e_ref)
                total = total + kl * (b64**2).mean()
                rows += 1
            G = len(members)
            total = total + G / beta * torch.nn.functional.softplus(beta / G * s)
    loss = total / rows
    loss.backward()
    return float(loss.detach()), b64.grad


# two prompts; prompt 0 holds two groups (local groups 0 and 1), prompt 1 one: sizes 2, 3, 2. K = 2 draws per group,
# shared by its members (DGPO's share_draws=group); the members differ by x0. A group's advantages do not sum to 0:
# with a constant velocity δ_i is linear in u = ε − x0, so for zero-sum advantages the shared ε would cancel from
# S_g and the two draws of a group could not be told apart (a grouping across draws would go unnoticed).
_DGPO_DRAWS = {(0, 0): [[0.25, 1.0], [-0.5, 0.5]], (0, 1): [[1.0, -0.5], [0.0, 0.25]], (1, 0): [[-0.75, 0.0], [0.5, 1.5]]}
_DGPO_LEAVES = [  # (prompt, local group, x0, advantage)
    (0, 0, [0.0, 0.5], 1.0), (0, 0, [1.0, -0.5], -0.5),
    (0, 1, [0.5, 0.5], 1.5), (0, 1, [-0.5, 1.0], -0.5), (0, 1, [0.0, -0.75], -0.5),
    (1, 0, [0.25, 0.25], 0.8), (1, 0, [-1.0, 0.5], -0.4),
]


@pytest.mark.parametrize("micro_batch", [1, 3, 64])
def test_dgpo_compares_each_group_on_each_draw(tmp_path, micro_batch):
    """DGPO's group preference L_g = softplus((β/G)·Σ_{i∈g} A_i·δ_i) is taken per (group, draw): the members of a
    group that share a draw (t, ε), G of them, and trained as (G/β)·L_g (docs/math.md §5); here β = 2, groups of 2, 3
    and 2 members, two draws, and ema_ref's velocity such that some members are clipped (their e_θ detached: the
    gradient, not the loss, shows it). Members of a group are drawn with one key, groups with different keys.
    Catches: grouping by sample (each row its own comparison), by batch or by draw only (all groups in one), by group
    across draws; β's placement; the clip taken against θ or the reference instead of ema_ref. Any micro-batch size
    gives the same loss and gradient: a micro-batch never splits a (group, draw) (``DGPOLearner.unit``); split by
    rows (``unit = "row"``, micro-batches of one row) the comparisons fall apart and the loss changes."""
    trainer = hand_trainer(tmp_path, "dgpo", "learner.train_times=2", "learner.dgpo.beta=2.0",
                           f"train.micro_batch={micro_batch}")
    learner, policy = trainer.learner, trainer.policy
    b, c = [0.5, -0.25], [0.75, 0.5]
    set_velocity(trainer, policy.params, b)
    set_velocity(trainer, learner.ema_ref.values, c)
    leaves = [(p, g, x0, a, [0.9, 0.8], _DGPO_DRAWS[p, g]) for p, g, x0, a in _DGPO_LEAVES]
    metrics = learner.update(hand_rollouts(trainer, leaves))
    groups = [[0, 1], [2, 3, 4], [5, 6]]
    loss, grad = dgpo_expected(leaves, groups, b, c, beta=2.0, kl=trainer.cfg.learner.kl_coef, K=2)
    assert_close_ulps(torch.tensor(metrics["loss"]), torch.tensor(loss), ulps=16, dtype=torch.float32)
    assert_close_ulps(bias_grad(trainer), grad, ulps=16, dtype=torch.float32)
    assert 0 < metrics["dgpo/clip_frac"] < 1  # the clip acts on some members: the gradient test above sees it
    keys = learner.keys_seen
    assert [len({keys[i] for i in g}) for g in groups] == [1, 1, 1] and len({keys[g[0]] for g in groups}) == 3
    if micro_batch == 1:
        learner.unit = "row"
        split = learner.update(hand_rollouts(trainer, leaves))["loss"]
        assert abs(split - loss) > 1e-3 * abs(loss)


# ------------------------------------------------------------------------------------------------
# 5. the normaliser of an optimizer step
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("micro_batch", [1, 2, 3])
@pytest.mark.parametrize("updates", [1, 2])
def test_a_step_loss_is_the_mean_over_its_rows(tmp_path, updates, micro_batch):
    """An optimizer step's loss is its rows' sum ÷ its rows, samples × K draws, over whole groups of unequal size,
    whatever the micro-batches (docs/math.md §5, ``ForwardLearner.normalisation``). AWM at ρ = 1 (kl terms off) makes
    each row's loss −A/A_max by hand. Groups of 1 and 3 trained samples (a fourth leaf has a NaN advantage: not a
    row), K = 2, micro-batches of 1, 2 or 3 rows (a group, and a sample's draws, split where the limit falls); with 2
    updates per epoch each step takes one group and is normalised by its own rows (the logged loss is the steps' sum). The advantage 7 is clipped to A_max = 5.
    Catches: dividing by samples instead of rows (K dropped), by groups, by draws, per group (mean of group means),
    per micro-batch, by the iteration's rows instead of the step's, or counting the masked leaf."""
    trainer = hand_trainer(tmp_path, "awm", "learner.train_times=2", "learner.kl_coef=0.0",
                           "learner.awm.ema_kl_coef=0.0", f"train.micro_batch={micro_batch}",
                           f"train.updates_per_epoch={updates}")
    set_velocity(trainer, trainer.policy.params, [0.5, 0.5])
    draws = ([0.5, 0.25], [[1.0, 0.0], [0.0, 1.0]])
    leaves = [(0, 0, [0.0, 0.0], 7.0, *draws),  # clipped to 5: −1 per row
              (1, 0, [0.5, 0.0], -1.0, *draws), (1, 0, [0.0, 0.5], -2.0, *draws), (1, 0, [0.5, 0.5], 0.5, *draws),
              (1, 0, [1.0, 1.0], float("nan"), *draws)]
    metrics = trainer.learner.update(hand_rollouts(trainer, leaves))
    # rows' losses −A/5: group 0: −1, −1; group 1: 0.2, 0.2, 0.4, 0.4, −0.1, −0.1 (sum 1.0)
    # one step: (−2 + 1)/8 = −0.125; two steps: −2/2 + 1/6 = −5/6
    expected = -0.125 if updates == 1 else -5.0 / 6.0
    assert metrics["trained_samples"] == 4
    assert_close_ulps(torch.tensor(metrics["loss"]), torch.tensor(expected), ulps=8, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------
# 6. DiffusionNFT: the two implicit policies, from θ_old
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("micro_batch", [1, 64])
def test_nft_negative_policy_is_the_reflection_through_theta_old(tmp_path, micro_batch):
    """DiffusionNFT's v⁺ = v_old + β·(v_θ − v_old) and v⁻ = v_old − β·(v_θ − v_old), v_old from θ_old (the copy
    ``learner.old``), on a hand batch where ℓ⁺ ≠ ℓ⁻ and r ∉ {0, 1} matter (docs/math.md §5, β = 1, A_max = 5).
    v_θ = [1, 1], v_old = [0.5, 1], v_ref = 0: v⁺ = [1, 1], v⁻ = 2·v_old − v_θ = [0, 1]; t = 0.5, err = t·(u − v).
    Catches: v⁻ computed like v⁺ (loss 2.5), v_old taken from θ (2.5) or from the reference/base (3.75), r and 1 − r
    swapped, the adaptive weight w± shared between the two terms."""
    trainer = hand_trainer(tmp_path, "diffusion_nft", "learner.train_times=1", "learner.kl_coef=0.0",
                           f"train.micro_batch={micro_batch}")  # one micro-batch, or one per sample
    learner, policy = trainer.learner, trainer.policy
    set_velocity(trainer, policy.params, [1.0, 1.0])
    set_velocity(trainer, learner.old.values, [0.5, 1.0])
    # sample 0: A = 0 (r = 0.5), u = [1, 1]: err⁺ = 0 → ℓ⁺ = 0; err⁻ = 0.5·[1, 0] = [0.5, 0] → ℓ⁻ = 0.125/0.25 = 0.5
    #           L0 = 5·(0.5·0 + 0.5·0.5) = 1.25
    # sample 1: A = −5 (r = 0), u = [−1, 1]: err⁻ = 0.5·[−1, 0] → ℓ⁻ = 0.5; L1 = 5·0.5 = 2.5
    leaves = [(0, 0, [0.0, 0.0], 0.0, [0.5], [[1.0, 1.0]]),
              (0, 0, [1.0, 0.0], -5.0, [0.5], [[0.0, 1.0]])]
    metrics = learner.update(hand_rollouts(trainer, leaves))
    assert_close_ulps(torch.tensor(metrics["loss"]), torch.tensor((1.25 + 2.5) / 2), ulps=8, dtype=torch.float32)
    # ∂ℓ⁻/∂v_θ = 2·err⁻·(+t·β)/(D·w⁻) (w detached): sample 0: 2·[0.5, 0]·0.5/(2·0.25) = [1, 0] → 5·0.5·[1, 0]
    # sample 1: 2·[−0.5, 0]·0.5/(2·0.25) = [−1, 0] → 5·[−1, 0]; mean over the 2 rows: ([2.5, 0] + [−5, 0])/2
    assert_close_ulps(bias_grad(trainer), torch.tensor([-1.25, 0.0]), ulps=8)
    assert metrics["max_abs_vplus_minus_vold_epoch0"] == 0.5  # |v⁺ − v_old| = |[0.5, 0]|: θ_old lags θ here


# ------------------------------------------------------------------------------------------------
# 7. micro-batches: at most train.micro_batch rows, every row once, DGPO's units whole
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["diffusion_nft", "awm", "dgpo"])
@pytest.mark.parametrize("limit", [1, 4, 7, 1000])
def test_micro_batches_hold_every_row_once_within_the_limit(tmp_path, preset, limit):
    """``ForwardLearner.pack``: groups of 3, 1 and 2 samples, K = 3 draws. Every (sample, draw) is in exactly
    one micro-batch, in group order; NFT and AWM micro-batches hold at most ``limit`` rows (a group and a sample's
    draws are split where it falls: an 81-frame video row is ~33k tokens); DGPO's hold whole (group, draw) units, so
    one exceeds the limit only when a unit alone does."""
    from flowgrpo.engine.learners.forward import Sample

    trainer = hand_trainer(tmp_path, preset, "learner.train_times=3")
    learner, K = trainer.learner, 3
    sizes = [3, 1, 2]
    samples = [Sample(0, i, 0.0, g, (g, i)) for g, n in enumerate(sizes) for i in range(sum(sizes[:g]), sum(sizes[:g + 1]))]
    by_group = {g: [i for i, s in enumerate(samples) if s.group == g] for g in range(3)}
    parts = learner.pack([0, 1, 2], by_group, samples, limit)
    cells = [(m.sample.leaf, k) for part in parts for m in part for k in m.draws]
    assert sorted(cells) == sorted((i, k) for i in range(6) for k in range(K)) and len(cells) == len(set(cells))
    assert [c[0] for c in cells] == sorted(c[0] for c in cells) or preset == "dgpo"  # group order, sample-major
    rows = [sum(len(m.draws) for m in part) for part in parts]
    if preset == "dgpo":
        for part in parts:  # a group's members on a draw are together
            for g, members in by_group.items():
                for k in range(K):
                    inside = {m.sample.leaf for m in part if m.sample.group == g and k in m.draws}
                    assert inside in (set(), set(members))
        assert all(r <= max(limit, max(sizes)) for r in rows)
    else:
        assert all(r <= limit for r in rows) and len(parts) == -(-6 * K // limit)
    # a gradient-noise probe's micro-batches hold whole groups: each is a small-batch gradient over its prompts
    probe = learner.pack([0, 1, 2], by_group, samples, limit, "group")
    where = {(m.sample.leaf, k): n for n, part in enumerate(probe) for m in part for k in m.draws}
    assert len(where) == 6 * K and all(len({where[i, k] for i in members for k in range(K)}) == 1
                                       for members in by_group.values())


# ------------------------------------------------------------------------------------------------
# 7. the one update loop (Learner.update, flowgrpo/engine/learners/base.py)
# ------------------------------------------------------------------------------------------------
def test_the_loop_takes_every_step_and_reads_the_contract_at_the_first(tmp_path):
    """``Learner.update`` takes inner_epochs × updates_per_epoch optimizer steps, and reads the ratio == 1 contract
    at the first step of inner epoch 0 only: θ is moved by hand after that step, so every later step of AWM sees
    ρ = exp(ℓ_θ − ℓ_old) ≠ 1 (its mean |ρ − 1| is logged), while the contract stays exactly 0.
    Catches: an inner epoch or an update skipped, the contract read over every step."""
    trainer = hand_trainer(tmp_path, "awm", "learner.train_times=2", "learner.kl_coef=0.0",
                           "learner.awm.ema_kl_coef=0.0", "train.inner_epochs=2", "train.updates_per_epoch=2")
    policy = trainer.policy
    set_velocity(trainer, policy.params, [0.5, 0.5])
    draws = ([0.5, 0.25], [[1.0, 0.0], [0.0, 1.0]])
    leaves = [(0, 0, [0.0, 0.0], 1.0, *draws), (0, 0, [0.5, 0.0], -1.0, *draws),
              (1, 0, [0.5, 0.5], 0.5, *draws), (1, 0, [0.0, 0.5], -0.5, *draws)]
    step, taken = policy.step, []

    def step_then_move(prompts):
        out = step(prompts)
        taken.append(prompts)
        set_velocity(trainer, policy.params, [0.75, 0.25])  # θ leaves the rollout's weights after the first step
        return out

    policy.step = step_then_move
    metrics = trainer.learner.update(hand_rollouts(trainer, leaves))
    assert len(taken) == 4 and metrics["skipped_steps"] == 0  # 2 epochs x 2 updates, each one group of one prompt
    assert metrics["max_abs_ratio_minus_1_epoch0"] == 0.0
    assert metrics["awm/max_abs_ratio_minus_1"] > 0.0


def test_a_filler_micro_batch_adds_nothing(tmp_path):
    """A sharded process with fewer micro-batches than another pads its step with fillers (``Policy.matched``: its
    first part again) so that every process makes the same network calls; a filler's loss is taken times 0. The same
    update with a filler after every step's micro-batches gives the same gradient and loss, bit for bit.
    Catches: the filler's loss not zeroed (its rows' gradient counted twice)."""
    draws = ([0.5, 0.25], [[1.0, 0.0], [0.0, 1.0]])
    leaves = [(0, 0, [0.0, 0.0], 1.0, *draws), (0, 0, [0.5, 0.0], -1.0, *draws),
              (1, 0, [0.5, 0.5], 0.5, *draws), (1, 0, [0.0, 0.5], -0.5, *draws)]
    outcomes = []
    for padded in (False, True):
        trainer = hand_trainer(tmp_path / str(padded), "awm", "learner.train_times=2", "learner.kl_coef=0.0",
                               "learner.awm.ema_kl_coef=0.0")
        policy = trainer.policy
        set_velocity(trainer, policy.params, [0.5, 0.5])
        if padded:
            matched = policy.matched
            policy.matched = lambda parts, spare: [*matched(parts, spare), (parts[0] if parts else spare(), False)]
        metrics = trainer.learner.update(hand_rollouts(trainer, leaves))
        outcomes.append((bias_grad(trainer).clone(), metrics["loss"]))
    (grad, loss), (padded_grad, padded_loss) = outcomes
    assert float(grad.abs().max()) > 0  # the step has a gradient to double
    assert torch.equal(padded_grad, grad) and padded_loss == loss, (grad, padded_grad, loss, padded_loss)
