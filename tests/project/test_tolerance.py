"""The tests' scaled float comparison (tests/tolerance.py): a difference of a few float32 ulps of the
values' magnitude passes, a real error fails with a message in ulps.

Run: pytest tests/project/test_tolerance.py -q
"""

import pytest
import torch

from tolerance import assert_close_ulps, ulp_tolerance

EPS32 = torch.finfo(torch.float32).eps


def _scores_near_30():
    """Four CLIPScore-like float32 scores and the same scores 3 ulps (eps · 30 each) away in one element:
    the 1.14e-5 seen between batch and single evaluation on another x86 machine."""
    batch = torch.tensor([30.0, 27.638635635375977, 24.949430465698242, 29.483497619628906])
    single = batch.clone()
    single[0] = batch[0] + 3 * EPS32 * 30.0  # 1.07e-5, exactly representable near 30
    return batch, single


def test_three_ulps_near_30_pass_where_an_absolute_1e_5_fails():
    batch, single = _scores_near_30()
    assert float((single - batch).abs().max()) > 1e-5
    with pytest.raises(AssertionError):  # the old comparison rejects plain rounding
        torch.testing.assert_close(single, batch, rtol=0, atol=1e-5)
    assert_close_ulps(single, batch, ulps=8)


def test_a_wrong_value_near_30_fails_with_the_difference_in_ulps():
    batch, _ = _scores_near_30()
    wrong = batch.clone()
    wrong[2] += 1e-3  # a real error, small next to the scores: 1e-3 / (eps · 30) ≈ 280 ulps
    with pytest.raises(AssertionError, match=r"batch vs single: .* at index \(2,\) \(2[78]\d ulps of torch\.float32 at "
                                             r"magnitude 30\) exceeds 8 ulps"):
        assert_close_ulps(wrong, batch, ulps=8, msg="batch vs single")


def test_the_tolerance_scales_with_magnitude_and_dtype():
    x = torch.tensor([0.5, -30.0])
    assert ulp_tolerance(x, 4) == pytest.approx(4 * EPS32 * 30)
    assert ulp_tolerance(x.double(), 4) == pytest.approx(4 * torch.finfo(torch.float64).eps * 30)
    assert ulp_tolerance(x.double(), 4, torch.float32) == pytest.approx(4 * EPS32 * 30)
    # a float32 result cast to float64 for the comparison: its own precision decides when named
    y = (x + 2 * EPS32 * 30).double()
    with pytest.raises(AssertionError, match="float64"):
        assert_close_ulps(y, x.double(), ulps=8)
    assert_close_ulps(y, x.double(), ulps=8, dtype=torch.float32)
    # by default the less precise of the two dtypes counts
    assert_close_ulps(y, x, ulps=8)


def test_nan_inf_shape_and_all_zero():
    nan, inf = float("nan"), float("inf")
    assert_close_ulps(torch.tensor([nan, inf, 1.0]), torch.tensor([nan, inf, 1.0]))
    with pytest.raises(AssertionError, match="NaN at different places"):
        assert_close_ulps(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0]))
    with pytest.raises(AssertionError, match=r"index \(1,\)"):  # an infinity elsewhere hides no other error
        assert_close_ulps(torch.tensor([inf, 5.0]), torch.tensor([inf, 1.0]))
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close_ulps(torch.zeros(2), torch.zeros(3))
    assert_close_ulps(torch.zeros(3), torch.zeros(3))
    with pytest.raises(AssertionError, match="only an exact match"):
        assert_close_ulps(torch.tensor([1e-30, 0.0]), torch.zeros(2))
