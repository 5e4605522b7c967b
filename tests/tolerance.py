"""Float comparisons scaled to the values compared, for the tests.

float32 carries 24 bits: a number near 30 is only known to eps·30 ≈ 3.6e-6 (eps = 2^-23, "one ulp" below
means eps times the magnitude). Two evaluations of the same formula in a different order (a batch of 4
vs 4 batches of 1, 1 vs 2 threads, another CPU's vector width) can differ by a few of those. An absolute
`atol=1e-5, rtol=0` on such a number allows under 3 ulps and fails on some machines (seen: 1.14e-5 = 3.2
ulps between batch and single CLIPScore evaluations on another x86). Compare instead within `ulps` units
of the compared values' magnitude:

    atol = ulps · finfo(dtype).eps · max|expected|

`dtype` is the precision the values were computed in: by default the less precise of the two tensors'
dtypes; pass it when a float32 result was cast to float64 for the comparison. The magnitude is the
largest |expected| over the whole tensor, because rounding in a shared computation (a matmul, a
normalisation) is of the size of the tensor's values, not of each small element. Keep `ulps` far below
the size of the error the test is there to catch; the failure message gives the difference in ulps.

Tests import it as a sibling module, like train_fixtures:

    from tolerance import assert_close_ulps
    assert_close_ulps(batch_scores, single_scores, ulps=16)
"""

import torch


def _magnitude(expected: torch.Tensor) -> float:
    """max|expected| over its finite entries (NaN and ±inf count as 0); 0 for an empty tensor."""
    finite = expected.detach().double().abs().nan_to_num(0.0, 0.0, 0.0)
    return float(finite.max()) if finite.numel() else 0.0


def ulp_tolerance(expected, ulps: float, dtype: torch.dtype | None = None) -> float:
    """The absolute tolerance: `ulps` units of `dtype`'s precision at the magnitude of `expected`."""
    expected = torch.as_tensor(expected)
    dtype = dtype or (expected.dtype if expected.is_floating_point() else torch.float32)
    return ulps * torch.finfo(dtype).eps * _magnitude(expected)


def assert_close_ulps(actual, expected, ulps: float = 8, *, dtype: torch.dtype | None = None, msg: str = ""):
    """Assert |actual - expected| <= ulps * eps(dtype) * max|expected| elementwise (NaN matches NaN).

    The AssertionError names the largest difference, where it is, the tolerance and the difference in ulps,
    so a failure tells rounding (a few ulps over) from a real error (thousands of ulps)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if dtype is None:
        floats = [t.dtype for t in (actual, expected) if t.is_floating_point()] or [torch.float32]
        dtype = min(floats, key=lambda d: torch.finfo(d).bits)
    where = f"{msg}: " if msg else ""
    if actual.shape != expected.shape:
        raise AssertionError(f"{where}shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not torch.equal(a.isnan(), e.isnan()):
        raise AssertionError(f"{where}NaN at different places: actual {a.tolist()}, expected {e.tolist()}")
    diff = torch.where((a == e) | a.isnan(), 0.0, (a - e).abs())  # equal infinities and matched NaNs agree
    unit = torch.finfo(dtype).eps * _magnitude(e)  # one ulp at the magnitude of the values
    tol = ulps * unit
    if diff.numel() and float(diff.max()) > tol:
        index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        worst = float(diff[index])
        in_ulps = f"{worst / unit:.3g} ulps" if unit > 0 else "expected is all zero: only an exact match passes"
        raise AssertionError(
            f"{where}largest difference {worst:.3g} at index {index} ({in_ulps} of {dtype} at magnitude "
            f"{_magnitude(e):.3g}) exceeds {ulps} ulps = {tol:.3g}; actual {a[index].item()!r}, "
            f"expected {e[index].item()!r}")
