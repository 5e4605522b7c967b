"""MixGRPO, MixGRPO-Flash and Flash* step by step against Tencent-Hunyuan/MixGRPO's sampler (reproduce/parity/mixgrpo.py)
on a tiny FLUX, where MIXGRPO_PATH names a checkout of it (the comparison imports that code at run time; the project
ships none of it): the σ grid, which steps are stochastic and trained, x' at every step and the window steps'
log-probs, within float32 ulps of the values, at several window positions of each preset, with the recipes' options as
they resolve (integer timesteps: the timestep each side's network is told is the same at every step; MixGRPO's float32
grid). The advantages of three rewards (zsum of normalised weights, std_correction 1) and the optimizer steps
(update_split samples) are the official ones; each option off differs (the report's controls). The positions where
the official run differs (a window cut at T − 2, a Flash tail of one point) are shown to differ."""

import math
import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout, number

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reproduce"))


CODE = "mixgrpo"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]


def test_every_preset_follows_the_official_sampler_step_by_step(reports):
    from parity import mixgrpo

    assert len(reports) == sum(len(v) for v in mixgrpo.SETTINGS.values())
    for report in reports.values():
        bad = [s for s in report.steps if not s.ok]
        assert report.ok, f"{report.method}: {len(bad)} steps differ, first {bad[:1]}; {report.notes}"
        assert any(s.trained[0] for s in report.steps) and all(s.dlogp is not None for s in report.steps if s.trained[0])


def test_flash_takes_the_official_number_of_steps(reports):
    """int((T − l − w + 1)·r̃) tail points, ends included: 11 steps for Flash and 7 for Flash* at window start 0."""
    steps = {name: len(r.steps) for name, r in reports.items()}
    assert steps["mixgrpo window start 0 (iteration 0)"] == 25
    assert steps["mixgrpo_flash window start 0 (iteration 0)"] == 11
    assert steps["mixgrpo_flash window start 9 (iteration 180)"] == 4 + 9 + 4
    assert steps["mixgrpo_flash_star window start 0 (iteration 460)"] == 7
    flash = reports["mixgrpo_flash window start 0 (iteration 0)"]
    assert [s.stochastic[1] for s in flash.steps] == [True] * 4 + [False] * 7
    assert [s.trained[1] for s in flash.steps] == [True] * 4 + [False] * 7


def notes(report, start: str) -> list[str]:
    return [n for n in report.notes if n.startswith(start)]


def test_each_network_call_is_told_the_official_timestep(reports):
    """sampling.integer_timesteps: flowgrpo's network is told ⌊1000σ⌋/1000 of its grid, the official int(σ·1000)/1000 of
    its float32 grid, equal at every step (Flash's float64 grid included); MixGRPO's grid is the official float32 one
    (|Δσ| 0). Off (the network told 1000σ), x' moves far beyond the tolerance."""
    for name, report in reports.items():
        told = notes(report, "timesteps told")
        assert len(told) == 1 and "flowgrpo's equal: True (sampling.integer_timesteps=True" in told[0], (name, told)
        control = notes(report, "control, sampling.integer_timesteps=false")
        if control:
            assert number(control[0], "max |Δx'| ") > 10 * max(s.tol_x for s in report.steps), control
        if name.startswith("mixgrpo window"):
            assert "grid linear_float32" in told[0] and report.worst()["sigma"] == 0.0
    assert sum(bool(notes(r, "control, sampling.integer_timesteps=false")) for r in reports.values()) == 3


def test_the_advantages_and_the_optimizer_steps_are_the_officials(reports):
    """zsum with std_correction 1 and the weights normalised: the official advantage_aggr of three rewards within float32
    ulps (std_correction 0: sqrt(12/11) times them); update_split=samples: 3 whole samples of the group a step, as the
    official steps every gradient_accumulation_steps = 3 samples (groups: one step takes all 12)."""
    firsts = [r for r in reports.values() if notes(r, "advantages of one set")]
    assert len(firsts) == 3
    for report in firsts:
        adv = notes(report, "advantages of one set")[0]
        assert number(adv, "max |Δ| ") <= number(adv, "(tolerance "), adv
        assert number(adv, "the official = ") == pytest.approx(math.sqrt(12 / 11), rel=1e-4)
        steps = notes(report, "optimizer steps")[0]
        assert "the official [3, 3, 3, 3] samples a step" in steps and "(train.update_split=samples) [3, 3, 3, 3]" in steps
        assert "transitions per sample [4]" in steps and "update_split=groups: [12, 0, 0, 0]" in steps


def test_the_known_differences_show_and_the_old_flash_grid_fails(checkout, monkeypatch):
    from parity import mixgrpo

    known = mixgrpo.run(checkout, mixgrpo.KNOWN_DIFFERENCES)
    assert [r.ok for r in known] == [False, False]
    cut = known[0]  # MixGRPO at start 21: official window {21, 22}, flowgrpo SDE on 21-24 (trained 21, 22)
    assert [s.step for s in cut.steps if s.stochastic[0] != s.stochastic[1]] == [23, 24]
    assert [s.step for s in cut.steps if s.trained[0] != s.trained[1]] == []
    tail = known[1]  # Flash at start 18: the official rollout stops at σ_22, flowgrpo steps on to 0
    assert len(tail.steps) == 23 and [s.step for s in tail.steps if not s.ok] == [22]
    # flowgrpo's grid before issue 44: ⌈(T − l − w)·r̃⌉ tail steps, 13 at window start 0 where the official takes 11
    import samplers.grids as grids

    monkeypatch.setattr(grids, "flash_tail_points",
                        lambda T, end, r: 0 if end == T else math.ceil((T - end) * r - 1e-9) + 1)
    old = mixgrpo.run(checkout, {"mixgrpo_flash": [(0, 0)]})[0]
    assert len(old.steps) == 13 and not old.ok
