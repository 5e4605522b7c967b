"""The optimizers (flowgrpo/engine/optim.py): Muon on the weights of two or more dimensions and AdamW on the rest,
as SAGE-GRPO's code trains (train.optimizer=muon), against a float64 transcription of docs/math.md's formulas and
against torch's own Muon; its state through a checkpoint; and the run's wiring."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.engine.optim import Muon, orthogonalize
from flowgrpo.run.checkpoint import optimizer_from_flat, optimizer_to_flat


def transcription(weights, grads_per_step, lr, decay, mu=0.95, betas=(0.95, 0.95), eps=1e-8):
    """docs/math.md's Muon and AdamW steps in float64, written out independently of the module."""
    a, b, c = 3.4445, -4.7750, 2.0315
    w = [x.double().clone() for x in weights]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    for n, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.double()
            if w[i].ndim >= 2:
                m[i] = mu * m[i] + g
                u = (g + mu * m[i]).reshape(g.shape[0], -1)
                x = u.T if u.shape[0] > u.shape[1] else u
                x = x / (torch.linalg.matrix_norm(x) + 1e-7)
                for _ in range(5):
                    s = x @ x.T
                    x = a * x + (b * s + c * s @ s) @ x
                o = (x.T if u.shape[0] > u.shape[1] else x).reshape(g.shape)
                w[i] = (1 - lr * decay) * w[i] - lr * 0.2 * math.sqrt(max(g.shape[0], g.shape[1])) * o
            else:
                m[i] = betas[0] * m[i] + (1 - betas[0]) * g
                v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
                step = lr * math.sqrt(1 - betas[1] ** n) / (1 - betas[0] ** n)
                w[i] = (1 - lr * decay) * w[i] - step * m[i] / (v[i].sqrt() + eps)
    return w


def _params_and_grads(steps=3):
    gen = torch.Generator().manual_seed(0)
    shapes = [(16, 8), (8, 24), (4, 3, 2, 2), (8,)]  # wide, tall (transposed), a convolution, a bias
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(steps)]
    return params, grads


def test_muon_steps_match_the_float64_transcription():
    """Three steps on a wide, a tall and a 4-D weight (Muon) and a bias (AdamW): every weight within float32 rounding
    of the float64 transcription. Catches: no Nesterov term, the √max(A, B) scale or weight decay dropped, AdamW's
    bias correction dropped. (Transposing a tall matrix only saves work: the iteration gives the same factor.)"""
    params, grads = _params_and_grads()
    start = [p.detach().clone() for p in params]
    opt = Muon(params, lr=1e-2, weight_decay=0.1)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    expected = transcription(start, grads, lr=1e-2, decay=0.1)
    for p, e, s in zip(params, expected, start):
        moved = float((e - s.double()).abs().max())
        assert float((p.detach().double() - e).abs().max()) <= 1e-4 * moved + 1e-6 * float(e.abs().max()), p.shape


def test_muon_agrees_with_torchs_muon_up_to_its_bfloat16_orthogonalisation():
    """torch.optim.Muon with the same choices (Nesterov, momentum 0.95, RMS-matched scale 0.2·√max(A, B)) orthogonalises
    in bfloat16, HunyuanVideo-1.5's Muon too: the same update direction (cosine > 0.99) and size within 5%."""
    params, grads = _params_and_grads(steps=1)
    w = params[0]
    ref = torch.nn.Parameter(w.detach().clone())
    ours = Muon([w], lr=1e-2)
    theirs = torch.optim.Muon([ref], lr=1e-2, weight_decay=0.0, momentum=0.95, nesterov=True,
                              adjust_lr_fn="match_rms_adamw")
    before = w.detach().clone()
    w.grad, ref.grad = grads[0][0].clone(), grads[0][0].clone()
    ours.step()
    theirs.step()
    a, b = (w.detach() - before).flatten(), (ref.detach() - before).flatten()
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.99
    assert float(a.norm() / b.norm()) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("shape", [(32, 8), (8, 32), (16, 16)])
def test_the_orthogonal_factor_keeps_the_singular_vectors_and_moves_the_values_toward_one(shape):
    m = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    o = orthogonalize(m)
    values = torch.linalg.svdvals(o)
    assert 0.6 < float(values.min()) and float(values.max()) < 1.3
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    projected = u.mT @ o @ vh.mT  # diagonal when O has M's singular vectors (its values in another order)
    off = projected - torch.diag(torch.diagonal(projected))
    assert float(off.abs().max()) < 1e-4 and bool(((torch.diagonal(projected) > 0.6) & (torch.diagonal(projected) < 1.3)).all())


def test_muons_state_survives_a_checkpoint():
    """The state as flowgrpo writes it (optimizer_to_flat) loads into a fresh optimizer whose next step is the same."""
    params, grads = _params_and_grads()
    opt = Muon(params, lr=1e-2, weight_decay=0.1)
    for step in grads[:2]:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    tensors, meta = optimizer_to_flat(opt)
    assert any(k.endswith("momentum_buffer") for k in tensors) and any(k.endswith("exp_avg") for k in tensors)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = Muon(copies, lr=1.0)
    optimizer_from_flat(again, tensors, meta)
    for opt_, ps in ((opt, params), (again, copies)):
        for p, g in zip(ps, grads[2]):
            p.grad = g.clone()
        opt_.step()
    assert all(torch.equal(p, q) for p, q in zip(params, copies))


def test_a_run_trains_with_the_optimizer_it_names(tmp_path):
    from train_fixtures import trainer_for

    trainer = trainer_for(tmp_path, "sage", "train.optimizer=muon", "train.iterations=1", "train.prompts_per_iteration=2")
    assert isinstance(trainer.policy.optimizer, Muon)
    assert isinstance(trainer_for(tmp_path / "adamw", "sage").policy.optimizer, torch.optim.AdamW)
