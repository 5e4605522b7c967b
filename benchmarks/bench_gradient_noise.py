"""How much signal is in one iteration's policy gradient? The gradient noise scale of a config.

    python benchmarks/bench_gradient_noise.py [--batches 8] [--video] [--preset NAME] [key=value overrides ...]

Builds the trainer of the embedded default (``--video``: the text-to-video one; plus overrides), then, at the *same* weights, draws
``--batches`` independent iterations (fresh prompts and noise each) and keeps each one's full
policy gradient (the update's gradient with the learning rate at zero, so nothing moves). With
g_k = g + n_k (true gradient g, noise of covariance Σ/B at B samples per iteration):

    |g|^2      ~ mean over pairs k != l of g_k . g_l          (unbiased; noise cancels)
    tr(Σ)/B    ~ mean_k |g_k|^2 - |g|^2
    B_noise    = B tr(Σ)/B / |g|^2 = tr(Σ)/|g|^2               samples for a gradient with SNR 1

It prints the pairwise cosine (0 = pure noise), the estimates and B_noise in samples. When no
signal is detectable (the pair products average less than two standard errors), it prints the lower
bound for B_noise that those two standard errors give. Prompts: ``prompts=...`` (a one-line .txt
file isolates one prompt's noise from the spread between prompts).
"""

import argparse
import math

import torch

from flowgrpo.config import load_config
from flowgrpo.engine.learners import Rollouts
from flowgrpo.engine.trainer import Trainer


def noise_scale(grads: torch.Tensor, samples: int) -> dict:
    """Statistics of K independent gradient estimates ``grads`` [K, P], each from ``samples`` samples.

    signal = |g|^2 (mean pair product), noise = tr(Sigma)/B (mean square norm minus signal), and
    b_noise = samples * noise / signal. When the signal is not above two standard errors of the pair
    products (``detected`` False), ``b_noise`` is the lower bound from ``signal_bound`` instead."""
    k = grads.shape[0]
    if k < 3:
        raise ValueError(f"need at least 3 gradient estimates, got {k}")
    g = grads.double()
    dots = g @ g.T
    off = ~torch.eye(k, dtype=torch.bool)
    pair, norms2 = dots[off], dots.diagonal()
    cos = pair / (norms2.sqrt()[:, None] * norms2.sqrt()[None, :])[off]
    signal = float(pair.mean())
    noise = float(norms2.mean()) - signal
    bound = 2 * float(pair.std()) / math.sqrt(k * (k - 1) / 2)  # pairs are not independent: a rough bound
    detected = signal > bound
    return {"cos_mean": float(cos.mean()), "cos_std": float(cos.std()), "signal": signal, "noise": noise,
            "signal_bound": bound, "detected": detected,
            "b_noise": samples * noise / (signal if detected else bound)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=8, help="independent iterations at the same weights (>= 3)")
    parser.add_argument("--video", action="store_true", help="the text-to-video default (configs/default_t2v.yaml)")
    parser.add_argument("--preset", default=None, help="a method preset (configs/presets/), as train_t2i.py --preset")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.batches < 3:
        parser.error("--batches must be at least 3")
    fixed = ["run_name=bench-gradient-noise", "resume=false", "eval.every=0", "eval.at_start=false", "log.gallery=false",
             "log.samples_every=0", "log.save_every=0", "log.tensorboard=false", "train.inner_epochs=1",
             "train.updates_per_epoch=1", "train.grad_clip=0", "train.learning_rate=0"]
    cfg = load_config(args.preset, None, [*args.overrides, *fixed], default="default_t2v" if args.video else "default")
    cfg.train.iterations = args.batches + 1
    trainer = Trainer(cfg)
    grads, rewards, samples = [], [], 0
    for k in range(args.batches):
        plan = trainer.schedule.plan(k)
        batches = trainer.sample(k, plan)
        advantages, stats = trainer.assign_credit(batches, plan)
        trainer.learner.update(Rollouts(k, plan, batches, advantages))
        grads.append(torch.cat([p.grad.flatten().double() for p in trainer.policy.params if p.grad is not None]))
        rewards.append({key: v for key, v in stats.items() if key.startswith("reward/") and key.endswith("_mean")})
        samples += len(stats["leaf_rewards"])  # scored samples (the leaves of tree plans)
        print(f"batch {k + 1}/{args.batches}: |g| {grads[-1].norm():.3e}  {rewards[-1]}", flush=True)
    samples //= args.batches
    stats = noise_scale(torch.stack(grads), samples)
    preset = args.preset or ("the video default" if args.video else "the image default")
    print(f"\nconfig: {preset} (sampling.plan.kernel={cfg.sampling.plan.get('kernel')}, learner {cfg.learner.name}), "
          f"{samples} samples per iteration, {grads[0].numel()} trained parameters")
    print(f"pairwise cosine of independent gradients: mean {stats['cos_mean']:+.4f}, std {stats['cos_std']:.4f}")
    print(f"|g|^2 (signal) {stats['signal']:.3e}   tr(Sigma)/B (noise) {stats['noise']:.3e}")
    if stats["detected"]:
        print(f"B_noise = {stats['b_noise']:,.0f} samples for a gradient with signal-to-noise 1 "
              f"({stats['b_noise'] / samples:,.1f} iterations of this size)")
    else:
        print(f"no signal detected; |g|^2 < {stats['signal_bound']:.3e}, so B_noise > {stats['b_noise']:,.0f} samples "
              f"(> {stats['b_noise'] / samples:,.1f} iterations of this size)")

if __name__ == "__main__":
    main()
