"""The analytic world (rewards/analytic.py, flowgrpo/models/analytic.py; docs/math.md §6): its exact velocity
against an independent Monte-Carlo estimate, the SDE kernels' marginals against the mixture's, the
rewards and the closed-form optimum by hand, and the adapter behind the ordinary model interface.
Run: pytest tests/worlds/test_analytic_world.py -q
"""

import math

import pytest
import torch

import samplers
from flowgrpo.models import load_model
from flowgrpo.models.analytic import mixture_velocity
from worlds import analytic as world
from rewards import load_reward


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def model(dim=2, **extra):
    return load_model({"family": "analytic", "pretrained": "analytic", "dim": dim, "finetune": "full", "device": "cpu",
                       "guidance_scale": 1.0, "shift": 3.0, **extra})


WEIGHTS = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)


def mc_velocity(x, sigma, weights, dim, n=400_000, seed=0):
    """E[x1 − x0 | x_σ = x] by self-normalised importance sampling over data samples x0 ~ p0:
    x1 = (x − (1−σ)·x0)/σ has weight N(x1; 0, I). Uses only draws from the data and the noise
    density — none of the closed-form velocity's algebra (component posteriors, gains)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.multinomial(weights, n, replacement=True, generator=g)
    x0 = world.mode_means(dim)[k] + world.MODE_STD * torch.randn(n, dim, generator=g, dtype=torch.float64)
    x1 = (x - (1 - sigma) * x0) / sigma
    logw = -0.5 * x1.square().sum(1)
    w = torch.softmax(logw, 0)
    est = (w.unsqueeze(1) * (x1 - x0)).sum(0)
    ess = 1.0 / w.square().sum()
    return est, float(ess)


@pytest.mark.parametrize("sigma", [0.35, 0.6, 0.85, 0.97])
@pytest.mark.parametrize("dim", [2, 5])
def test_mixture_velocity_matches_a_monte_carlo_estimate(sigma, dim):
    points = torch.tensor([[0.3, -0.2], [1.2, 1.1], [-0.9, 0.4]], dtype=torch.float64)
    points = torch.cat([points, 0.1 * torch.ones(3, dim - 2, dtype=torch.float64)], 1)
    exact = mixture_velocity(points, torch.full((3,), sigma), WEIGHTS.expand(3, -1), world.mode_means(dim),
                             torch.full((4,), world.MODE_STD, dtype=torch.float64))
    for i, x in enumerate(points):
        est, ess = mc_velocity(x, sigma, WEIGHTS, dim, seed=i)
        assert ess > 500, ess  # enough effective samples for the tolerance below
        # |x1 − x0| is O(3); the MC standard error is about 3/sqrt(ess)
        assert torch.allclose(est, exact[i], atol=6 * 3.0 / math.sqrt(ess)), (sigma, dim, est, exact[i], ess)


def test_mixture_velocity_endpoints_and_single_component():
    means, stds = world.mode_means(3), torch.full((4,), world.MODE_STD, dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64)
    w = WEIGHTS.expand(5, -1)
    # σ = 1: v = x − Σ_k w_k·m_k (the posterior is the prior); σ = 0: v_k = −m_k − (x − m_k) = −x
    assert torch.allclose(mixture_velocity(x, torch.ones(5), w, means, stds), x - WEIGHTS @ means, atol=1e-12)
    assert torch.allclose(mixture_velocity(x, torch.zeros(5), w, means, stds), -x, atol=1e-12)
    # one component: the affine Gaussian velocity of tests/samplers/test_marginals.py
    one = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64).expand(5, -1)
    sigma, s2 = 0.4, world.MODE_STD**2
    var = (1 - sigma) ** 2 * s2 + sigma**2
    expected = (sigma - (1 - sigma) * s2) / var * (x - (1 - sigma) * means[2]) - means[2]
    assert torch.allclose(mixture_velocity(x, torch.full((5,), sigma), one, means, stds), expected, atol=1e-12)


def exact_marginal_samples(sigma, weights, dim, n, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.multinomial(weights, n, replacement=True, generator=g)
    x0 = world.mode_means(dim)[k] + world.MODE_STD * torch.randn(n, dim, generator=g, dtype=torch.float64)
    return (1 - sigma) * x0 + sigma * torch.randn(n, dim, generator=g, dtype=torch.float64)


def cell_frequencies(x, sigma):
    """Fraction of samples nearest to each scaled mode centre (1−σ)·m_k (σ < 1), [K]."""
    return world.mode_masses(x / (1 - sigma))


def mixture_rollout(kernel, n, T, dim, eta=None, endpoints_only=False):
    """n independent rollouts of the exact flow of the mixture with weights WEIGHTS (the record, or
    only the endpoints)."""
    weights = WEIGHTS.float()
    velocity = lambda x, s, c: mixture_velocity(x, s, weights.expand(len(x), -1), world.mode_means(dim),  # noqa: E731
                                                 torch.full((4,), world.MODE_STD, dtype=torch.float64)).float()
    plan = samplers.compose_plan(T, kernel=kernel, eta=eta, group_size=n, initial_noise="independent", shift=3.0)
    run = samplers.sample_endpoints if endpoints_only else samplers.rollout
    return plan, run(velocity, plan, prompt_ids=[0], latent_shape=(dim,), seed=4)


@pytest.mark.parametrize("kernel", ["flow_sde", "dance_sde", "sage_sde", "ode"])
def test_every_kernel_keeps_the_mixture_marginals(kernel):
    """6,000 rollouts of the exact mixture flow (T = 40) per kernel: at several σ along the way the
    samples' cell frequencies around the scaled modes, mean and second moment match the exact
    marginal Σ_k w_k·N((1−σ)·m_k, c_k²·I); at σ = 0 the mode masses are the mixture weights. This is
    the strong form of the single-Gaussian test (tests/samplers/test_marginals.py): a nonlinear
    velocity. (cps does not keep marginals at all: the next test.)"""
    n, T, dim = 6000, 40, 3
    plan, record = mixture_rollout(kernel, n, T, dim)
    sig = plan.sigmas.float().double().tolist()
    checks = [(T, record.leaf_state.double())]
    if kernel != "ode":
        checks += [(i, record.state[record.step == i].double()) for i in (10, 20, 30)]
    for i, x in checks:
        sigma = sig[i]
        ref = exact_marginal_samples(sigma, WEIGHTS, dim, 200_000, seed=i)
        got = cell_frequencies(x, sigma) if sigma < 1 else None
        want = cell_frequencies(ref, sigma)
        # binomial standard error of a cell frequency from n samples, plus a discretisation allowance
        tol = 4.5 * torch.sqrt(want * (1 - want) / n) + 0.012
        assert torch.all((got - want).abs() < tol), (kernel, sigma, got, want)
        for stat in (lambda z: z[:, :2].mean(0), lambda z: z.square().sum(1).mean().unsqueeze(0)):
            a, b = stat(x), stat(ref)
            scale = stat(ref).abs().max() + 1.0
            assert torch.all((a - b).abs() < 0.05 * scale), (kernel, sigma, a, b)
    final = world.mode_masses(record.leaf_state)
    assert torch.allclose(final, WEIGHTS, atol=4.5 * math.sqrt(0.25 / n) + 0.012), (kernel, final)


@pytest.mark.parametrize("steps", [40, 120])
def test_cps_narrows_the_modes_and_moves_mass_to_the_heavier_ones(steps):
    """cps re-noises a fixed fraction of σ' around the posterior *mean* x̂0 at every step (docs/math.md §1),
    so on multimodal data it pulls samples inward: each mode comes out narrower than s = 0.25, and the
    heaviest mode gains mass, however many steps (the single-Gaussian test shows the variance loss;
    the mixture shows the mass shift too; docs/samplers.md)."""
    _, ends = mixture_rollout("cps", 3000, steps, 3, eta=0.8, endpoints_only=True)
    x = ends.final.double()
    nearest = world.nearest_mode(x)
    within = torch.stack([(x[nearest == k] - world.mode_means(3)[k]).std(0).mean() for k in range(4)])
    assert torch.all(within < 0.85 * world.MODE_STD), within  # measured 0.18–0.20
    masses = world.mode_masses(x)
    assert masses[3] > WEIGHTS[3] + 0.025 and masses[0] < WEIGHTS[0] - 0.015, masses  # measured 0.44–0.445, 0.065–0.075


def test_prompts_parse_and_bad_prompts_name_the_grammar():
    assert world.parse_targets("mode 3") == (3,)
    assert world.parse_targets("  Modes 2, 0 and 1 ") == (0, 1, 2)
    assert world.parse_targets("the left half") == (1, 2)
    assert world.target_mask(["the upper half"]).tolist() == [[1.0, 1.0, 0.0, 0.0]]
    for bad in ("mode 4", "a cat", "modes and"):
        with pytest.raises(ValueError, match="'mode k' or 'modes i and j'"):
            world.parse_targets(bad)
    # base weights: w ∝ 1 + adherence·[target]; no target (the CFG row): uniform
    w = world.base_weights(world.target_mask(["mode 2", "the left half"]))
    assert torch.allclose(w, torch.tensor([[0.2, 0.2, 0.4, 0.2], [1 / 6, 1 / 3, 1 / 3, 1 / 6]], dtype=torch.float64))
    assert torch.allclose(world.base_weights(torch.zeros(1, 4)), torch.full((1, 4), 0.25, dtype=torch.float64))


def test_rewards_by_hand():
    means = world.mode_means(2).float()
    x = torch.stack([means[0], means[1] + torch.tensor([0.1, 0.0]), torch.zeros(2) + torch.tensor([0.01, 0.02])])
    x = torch.cat([x, torch.zeros(3, 1)], 1)  # d = 3: the third coordinate does not matter
    prompts = ["mode 0", "the right half", "the upper half"]
    hit = load_reward("analytic_hit")(x, prompts)
    # sample 1 is nearest to mode 1 (not in the right half); sample 2 (near the origin, x>0, y>0) to mode 0
    assert hit.scores.tolist() == [1.0, 0.0, 1.0]
    smooth = load_reward("analytic_smooth")(x, prompts).scores
    d_right = (means[1] + torch.tensor([0.1, 0.0]) - means[0]).square().sum()  # mode 0 is the nearest right-half mode
    d_upper = (torch.tensor([0.01, 0.02]) - means[0]).square().sum()
    expected = torch.tensor([1.0, math.exp(-float(d_right) / 2), math.exp(-float(d_upper) / 2)])
    assert torch.allclose(smooth, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="scores samples"):
        load_reward("analytic_hit")(torch.rand(2, 3, 8, 8), ["mode 0", "mode 1"])
    with pytest.raises(ValueError, match="not pictures"):
        load_reward("toy")(x, prompts)


def test_kl_optimum_by_hand():
    w = torch.tensor([0.4, 0.2, 0.2, 0.2])
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    got = world.kl_optimum(w, r, beta=0.5)
    top = 0.4 * math.exp(2.0)
    assert got[0].item() == pytest.approx(top / (top + 0.6), rel=1e-12)
    assert got.sum().item() == pytest.approx(1.0, rel=1e-12)
    assert torch.allclose(world.kl_optimum(w, r, beta=1e6), w.double(), rtol=1e-5)  # β → ∞: the base
    with pytest.raises(ValueError, match="beta must be > 0"):
        world.kl_optimum(w, r, beta=0.0)


def test_the_adapter_is_an_ordinary_flow_model():
    m = model(dim=4)
    assert m.latent_shape() == (4,) and m.modality == "vector" and m.shift == 3.0
    cond = m.encode_prompts(["mode 1", "the lower half"])
    assert torch.allclose(cond.prompt_embeds[:, 0].double(), world.base_weights(world.target_mask(["mode 1", "the lower half"])))
    assert cond.negative_prompt_embeds[0, 0].tolist() == [0.25] * 4  # the unconditional row
    x, sigma = torch.randn(2, 4), torch.tensor([0.3, 0.9])
    # the zero-initialised residual: the policy is the exact base, and so is the reference
    exact = mixture_velocity(x, sigma, cond.prompt_embeds[:, 0], m.means, m.stds).float()
    assert torch.equal(m.velocity(x, sigma, cond), exact)
    with m.reference():
        assert torch.equal(m.velocity(x, sigma, cond), exact)
    # CFG batches [uncond; cond] like every family: v_u + g·(v_c − v_u)
    uncond = mixture_velocity(x, sigma, torch.full((2, 4), 0.25), m.means, m.stds).float()
    assert torch.allclose(m.velocity(x, sigma, cond, guidance_scale=3.0), uncond + 3.0 * (exact - uncond), atol=1e-5)
    assert torch.equal(m.decode(x), x)
    with pytest.raises(ValueError, match=r"expected \[N, 4\]"):
        m.velocity(torch.randn(2, 3), sigma, cond)
    previews = m.preview(x, torch.tensor([0, 0]), ["mode 1", "the lower half"])
    assert previews.shape == (2, 3, 128, 128) and 0 <= previews.min() and previews.max() <= 1


def test_lora_is_refused_with_the_fix_and_a_saved_network_reloads(tmp_path):
    with pytest.raises(ValueError, match="set model.finetune: full"):
        model(finetune="lora")
    m = model()
    with torch.no_grad():
        m.transformer.out.bias.fill_(0.5)
    m.save_trainable(tmp_path / "net")
    again = model(pretrained=str(tmp_path / "net"))
    assert torch.equal(again.transformer.out.bias, torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="d = 2, but model.dim = 3"):
        model(dim=3, pretrained=str(tmp_path / "net"))


def test_train_t2i_runs_the_analytic_config_with_any_preset_and_writes_scatter_samples(tmp_path):
    """The README's command, in process: train_t2i.py --config configs/analytic.yaml --preset mixgrpo.
    Samples are scatter-plot PNGs (one per sample, among its group) with the usual manifest, held-out
    evaluations are written per step, and the gallery is built."""
    import importlib.util
    import json

    from PIL import Image

    from flowgrpo.run.paths import configs_dir

    spec = importlib.util.spec_from_file_location("train_t2i", configs_dir().parent / "train_t2i.py")
    train_t2i = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_t2i)
    code = train_t2i.main(["--config", str(configs_dir() / "analytic.yaml"), "--preset", "mixgrpo", f"output_dir={tmp_path}",
                           "train.iterations=4", "log.samples_every=2", "eval.every=2", "log.progress=false"])
    assert code == 0
    run = tmp_path / "analytic"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert all(r["max_abs_ratio_minus_1_epoch0"] == 0.0 for r in rows if "loss" in r)
    assert {r["iteration"] for r in rows if "eval/mean_score" in r} == {0, 2, 4}
    manifest = [json.loads(line) for line in (run / "samples" / "step_4" / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 8 * 4 and {"prompt", "group", "rewards", "advantage", "file"} <= set(manifest[0])
    assert set(manifest[0]["rewards"]) == {"analytic_hit"}
    image = Image.open(run / "samples" / "step_4" / manifest[0]["file"])
    assert image.size == (128, 128) and image.mode == "RGB"
    assert len(list((run / "samples" / "eval_4").glob("*.png"))) == 64
    assert (run / "gallery" / "index.html").is_file()
    log = (run / "train.log").read_text()  # the end-of-run summary: before/after with standard errors, and the compare view
    assert "held-out analytic_hit over 256 samples: iteration 0 " in log and "-> iteration 4 " in log and "per task: half" in log
    assert "over the second half (iterations 2-4, 2 evaluations averaged per sample): " in log
    assert "index.html#view=compare" in log
    assert len((run / "eval_scores.jsonl").read_text().splitlines()) == 3


def test_a_diverged_policy_stops_with_one_clear_message(tmp_path):
    """Learning rate 1e5 without gradient clipping sends the residual network to inf/NaN; the run stops
    with a message that names the fix (not a reward's complaint about its input)."""
    from flowgrpo.config import load_config
    from flowgrpo.run.paths import configs_dir
    from flowgrpo.engine.trainer import Trainer

    cfg = load_config(None, None, [f"output_dir={tmp_path}", "log.progress=false", "train.iterations=30", "eval.every=0",
                                   "log.samples_every=0", "train.learning_rate=1e5", "train.grad_clip=0"],
                      base=str(configs_dir() / "analytic.yaml"))
    with pytest.raises(RuntimeError, match=r"NaN or inf.*lower train\.learning_rate"):
        Trainer(cfg).train()
