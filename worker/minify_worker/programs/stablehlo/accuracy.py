"""Outputs against a reference of the same precision (XLA with default options, the interpreter):
numpy only, and written into repro.py verbatim (`artifacts.render_repro`), so the repro judges
as the worker did.

Each floating-point output is compared with `allclose` within the tolerance, NaNs equal, shapes
equal. Integer and boolean outputs have no rounding: they are compared exactly, strict or not, as
the FX jobs' oracle compares them (`minify_contract.accuracy`; XLA's rule used to skip them unless
strict, and a wrong integer result went unseen).
Not torch's `same`: without an fp64 reference it passes every non-strict mismatch, and with
one it cannot judge a NaN the reference has too. Against the program promoted to f64
(`minify.reference=f64`) the worker uses torch's rule (`run.compare`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def differs(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray], tolerance: float,
            strict: bool) -> str | None:
    """None when `outputs` match `reference`, else what differs first."""
    if len(reference) != len(outputs):
        return f"{len(outputs)} outputs where the reference has {len(reference)}"
    for position, (want, got) in enumerate(zip(reference, outputs, strict=True)):
        mismatch = _mismatch(position, np.asarray(want), np.asarray(got), tolerance, strict)
        if mismatch is not None:
            return mismatch
    return None


def differs_from_fp64(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray], fp64: Sequence[np.ndarray],
                      tolerance: float, strict: bool) -> str | None:
    """torch's rule with an fp64 reference (`same`, torch/_dynamo/utils.py, in numpy): an output
    that is not `allclose` to the reference fails when its RMSE against the fp64 outputs exceeds
    the reference's times a multiplier (3 for half precision, small outputs or a large tolerance,
    else 2) plus a tenth of the tolerance; where both RMSEs are NaN it cannot judge, and passes."""
    if len(reference) != len(outputs) or len(fp64) != len(outputs):
        return f"{len(outputs)} outputs where the reference has {len(reference)}"
    for position, (want, got, wide) in enumerate(zip(reference, outputs, fp64, strict=True)):
        want, got = np.asarray(want), np.asarray(got)
        mismatch = _mismatch(position, want, got, tolerance, strict)
        if mismatch is None:
            continue
        if not is_floating(got) or want.shape != got.shape:
            return mismatch
        wide = np.asarray(wide, dtype=np.float64)
        ref_error = float(np.sqrt(np.mean((wide - want.astype(np.float64)) ** 2)))
        res_error = float(np.sqrt(np.mean((wide - got.astype(np.float64)) ** 2)))
        multiplier = 3.0 if got.dtype.name in ("float16", "bfloat16") or wide.size < 1000 or tolerance >= 2e-2 else 2.0
        if res_error <= multiplier * ref_error + tolerance / 10.0 or (np.isnan(ref_error) and np.isnan(res_error)):
            continue
        return (f"output {position}: RMSE against fp64 {res_error:.5g}, the reference's {ref_error:.5g} "
                f"(multiplier {multiplier})")
    return None


def is_floating(array: np.ndarray) -> bool:
    return bool(np.issubdtype(array.dtype, np.inexact)) or array.dtype.name.startswith(("bfloat", "float8"))


def _mismatch(position: int, want: np.ndarray, got: np.ndarray, tolerance: float, strict: bool) -> str | None:
    if want.shape != got.shape:
        return f"output {position} has shape {list(got.shape)} where the reference has {list(want.shape)}"
    if not is_floating(want):
        return _integer_mismatch(position, want, got)
    wide_want = want.astype(np.complex128 if np.iscomplexobj(want) else np.float64)
    wide_got = got.astype(wide_want.dtype)
    if np.allclose(wide_want, wide_got, rtol=tolerance, atol=tolerance, equal_nan=True):
        return None
    gaps = np.where(np.isnan(wide_want) != np.isnan(wide_got), np.inf, np.abs(wide_want - wide_got)).ravel()
    worst = int(np.nanargmax(gaps))
    return (f"output {position} not within tolerance {tolerance}: {got.ravel()[worst]} where the reference "
            f"has {want.ravel()[worst]} (element {worst})")


def _integer_mismatch(position: int, want: np.ndarray, got: np.ndarray) -> str | None:
    differ = np.asarray(want != got).ravel()
    if not differ.any():
        return None
    first = int(np.argmax(differ))
    return (f"output {position}: {int(differ.sum())} of {differ.size} elements differ exactly; "
            f"{got.ravel()[first]} where the reference has {want.ravel()[first]} (element {first})")
