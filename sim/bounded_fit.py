"""The bounded least squares behind the fitted profiles (sim.fit_profiles: GPU engine terms; sim.fit_hf:
the hf-fit CPU term). Pure numpy.

Each term (an object with `lo` and `hi`) lives in a logistic reparametrisation of its physical range,
x = lo + (hi - lo) / (1 + exp(-z)), so every step stays inside the bounds; Levenberg-Marquardt descends on
the caller's residuals in z. Deterministic: no random starts.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def _bounds(terms) -> tuple[np.ndarray, np.ndarray]:
    return np.array([t.lo for t in terms]), np.array([t.hi for t in terms])


def to_x(z, terms) -> np.ndarray:
    lo, hi = _bounds(terms)
    return lo + (hi - lo) / (1.0 + np.exp(-np.asarray(z, float)))


def to_z(x, terms) -> np.ndarray:
    lo, hi = _bounds(terms)
    u = np.clip((np.asarray(x, float) - lo) / (hi - lo), 0.02, 0.98)
    return np.log(u / (1.0 - u))


def values(z, terms) -> dict[str, float]:
    """Term name -> value at logistic coordinates `z`."""
    return {t.name: float(v) for t, v in zip(terms, to_x(z, terms))}


def descend(residuals: Callable[[np.ndarray], np.ndarray], z, max_iter: int,
            jacobian: Callable | None = None) -> tuple[float, np.ndarray]:
    """Levenberg-Marquardt from `z` on `residuals(z)` (sum of squares); (cost, z) at the end. `jacobian(z, r)`
    (optional) gives d residuals / d z at z (residuals r there), e.g. one that re-evaluates only what each
    coordinate reaches; default: forward differences of `residuals`."""
    z = np.asarray(z, float)
    r = residuals(z)
    cost, lam = float(r @ r), 1e-2
    for _ in range(max_iter):
        if jacobian is not None:
            jac = jacobian(z, r)
        else:
            h = 1e-4
            jac = np.empty((len(r), len(z)))
            for j in range(len(z)):
                dz = z.copy()
                dz[j] += h
                jac[:, j] = (residuals(dz) - r) / h
        g, a = jac.T @ r, jac.T @ jac
        improved = False
        for _ in range(8):
            # Marquardt damping with a floor (terms the rows barely see must not take huge steps), and
            # steps of at most 2 in the logistic coordinates
            damp = np.diag(a) + 1e-3 * max(float(np.max(np.diag(a))), 1e-12)
            step = np.linalg.solve(a + lam * np.diag(damp), -g)
            step *= min(1.0, 2.0 / max(float(np.max(np.abs(step))), 1e-12))
            z_new = np.clip(z + step, -12, 12)
            r_new = residuals(z_new)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                improved = cost - c_new > 1e-10 * max(cost, 1e-12)
                z, r, cost, lam = z_new, r_new, c_new, max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved:
            break
    return cost, z


def mape(pred, measured) -> float:
    """Mean absolute percentage error of `pred` against `measured`."""
    pred, measured = np.asarray(pred, float), np.asarray(measured, float)
    return float(np.mean(np.abs(pred - measured) / measured) * 100)
