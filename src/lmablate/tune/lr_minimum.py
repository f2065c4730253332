"""The learning rate at the full budget: a bracket of trained points (:class:`Point`,
:func:`next_lr`), the minimum of a quadratic in log learning rate fitted through them
(:func:`fit_minimum`), and how much the choice may cost (:func:`tuning_uncertainty`, a parametric
bootstrap of the points; nats/char).

Pure functions of the full-budget results (no Optuna, no torch), so the tuner
(:mod:`lmablate.tune.tuning`) and the report decide from the same numbers, and tests can feed
them constructed curves. What ``best.json`` records is computed without a BLAS or SIMD kernel:
numpy's least squares (OpenBLAS) and its vectorised sums round differently on AVX2 and AVX-512
CPUs, and a last-bit change in a fitted learning rate trains other bytes on every seed of a
variant; the fit is solved exactly in rationals and rounded once (:func:`quadratic_fit`), and
means are correctly rounded sums (``math.fsum``). The rules and their sources: the handbook's Study design, "The learning
rate at the full budget" and "Tuning uncertainty"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

UNCERTAINTY_QUANTILE = 0.95
BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SEED = 0  # fixed: the same points give the same uncertainty, to the byte
NEIGHBOURS = 2  # points on each side of the best that the quadratic is fitted over

BRACKETED = "bracketed"
AT_LIMIT = "at the limit tune.lr_limits"
OUT_OF_POINTS = "not bracketed within tune.bracket_points"


@dataclass(frozen=True)
class Point:
    """One learning rate (per step, the schedule's peak) trained at the full budget: ``losses``
    the final validation loss of each tuning seed (nats/char; ``inf`` for a seed that
    diverged)."""

    lr: float
    losses: tuple[float, ...]

    @property
    def loss(self) -> float:
        """The mean over seeds; ``inf`` when any seed diverged or none finished."""
        if not self.losses or not all(math.isfinite(x) for x in self.losses):
            return math.inf
        return math.fsum(self.losses) / len(self.losses)


def best_index(points: list[Point]) -> int:
    """Index (in ``points``, sorted by lr) of the lowest mean loss; the lower lr on a tie, so
    that points that all diverged extend the bracket downwards."""
    return min(range(len(points)), key=lambda i: (points[i].loss, points[i].lr))


def next_lr(points: list[Point], factor: float, limits: tuple[float, float]
            ) -> tuple[str, float | None]:
    """``(state, lr)``: where the bracket stands and the next learning rate to train, if any.

    ``points`` sorted by lr. ``state`` is :data:`BRACKETED` (a worse point on each side of the
    best, each within ``factor``), ``"extend"`` with the next lr (one ``factor`` past the end
    the best sits on, or the end of ``limits`` when nearer), or :data:`AT_LIMIT` (the best is
    at an end of ``limits``). A study that
    runs out of points says :data:`OUT_OF_POINTS` itself.

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("no full-budget points to bracket")
    i = best_index(points)
    best = points[i]
    below = i > 0 and points[i - 1].loss > best.loss and best.lr / points[i - 1].lr <= factor * (
        1 + 1e-9)
    above = (i < len(points) - 1 and points[i + 1].loss > best.loss
             and points[i + 1].lr / best.lr <= factor * (1 + 1e-9))
    if below and above:
        return BRACKETED, None
    # past an end, one factor further, or to the hard limit when that is nearer
    if i == 0:
        low = points[0].lr
        return (AT_LIMIT, None) if low <= limits[0] * (1 + 1e-9) else (
            "extend", max(low / factor, limits[0]))
    if i == len(points) - 1:
        high = points[-1].lr
        return (AT_LIMIT, None) if high >= limits[1] * (1 - 1e-9) else (
            "extend", min(high * factor, limits[1]))
    # an interior best whose neighbours tie with it or lie too far: no further point helps
    return BRACKETED, None


@dataclass(frozen=True)
class Fit:
    """The chosen learning rate and the curve behind it.

    ``lr`` is the vertex of ``coefficients`` (``a, b, c`` of ``a x^2 + b x + c``, x = ln lr,
    loss in nats/char) when ``used`` says ``"vertex"``, else the best point's lr; ``loss`` the
    fitted loss there (or the best point's mean); ``lrs`` the learning rates fitted over;
    ``note`` why the best point was taken instead of a vertex, empty otherwise."""

    lr: float
    loss: float
    used: str
    coefficients: tuple[float, float, float] | None
    lrs: tuple[float, ...]
    note: str = ""

    def curve(self, lr: np.ndarray | float) -> np.ndarray | float:
        """The fitted loss at ``lr`` (nats/char); NaN without a fit."""
        if self.coefficients is None:
            return np.nan * np.asarray(lr)
        return np.polyval(self.coefficients, np.log(lr))


def _neighbourhood(points: list[Point]) -> list[Point]:
    """The best point and up to :data:`NEIGHBOURS` finite points on each side."""
    finite = [p for p in points if math.isfinite(p.loss)]
    if not finite:
        return []
    i = best_index(finite)
    return finite[max(0, i - NEIGHBOURS):i + NEIGHBOURS + 1]


def fit_minimum(points: list[Point]) -> Fit:
    """The minimum of a quadratic in ln lr fitted (least squares, numpy.polyfit) through the
    best point and its neighbours (see the module docstring); the best point when fewer than
    three finite points, a concave fit, a vertex outside the points fitted or a fitted loss
    below 0 there (a cross-entropy cannot be: an arithmetic answer loss that falls from 0.6
    to 0.02 between two points is no parabola).

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("no full-budget points to fit")
    near = _neighbourhood(points)
    best = points[best_index(points)]
    lrs = tuple(p.lr for p in near)
    if len(near) < 3:
        return Fit(best.lr, best.loss, "best point", None, lrs,
                   f"{len(near)} finite point(s): too few for a curve")
    x = [Fraction(math.log(p.lr)) for p in near]
    exact = quadratic_fit(x, [Fraction(p.loss) for p in near])
    coefficients = tuple(float(c) for c in exact)
    a, b, c = exact
    if a <= 0:
        return Fit(best.lr, best.loss, "best point", coefficients, lrs,
                   "the fitted curve is not convex")
    vertex = -b / (2 * a)
    if not min(x) <= vertex <= max(x):
        return Fit(best.lr, best.loss, "best point", coefficients, lrs,
                   "the fitted minimum lies outside the points")
    lowest = float((a * vertex + b) * vertex + c)
    if lowest < 0:
        return Fit(best.lr, best.loss, "best point", coefficients, lrs,
                   "the fitted minimum lies below 0")
    return Fit(math.exp(float(vertex)), lowest, "vertex", coefficients, lrs)


def quadratic_fit(x: list[Fraction], y: list[Fraction]) -> tuple[Fraction, Fraction, Fraction]:
    """``(a, b, c)`` of the least-squares parabola ``y = a x^2 + b x + c`` through at least
    three points with at least three distinct ``x``, exactly: the normal equations solved in
    rationals by Cramer's rule (what ``numpy.polyfit(x, y, 2)`` approximates in floating
    point). Exact arithmetic on the float inputs has one answer on every machine.

    Raises:
        ValueError: fewer than three distinct ``x``."""
    s = [sum(xi ** k for xi in x) for k in range(5)]  # power sums s_0 .. s_4
    t = [sum(yi * xi ** k for xi, yi in zip(x, y)) for k in range(3)]  # moments t_0 .. t_2
    m = [[s[4], s[3], s[2]], [s[3], s[2], s[1]], [s[2], s[1], s[0]]]
    det = _det3(m)
    if det == 0:
        raise ValueError(f"a parabola needs three distinct x, got {len(set(x))}")
    rhs = [t[2], t[1], t[0]]
    return tuple(_det3([[rhs[r] if j == col else m[r][j] for j in range(3)] for r in range(3)])
                 / det for col in range(3))


def _det3(m: list[list[Fraction]]) -> Fraction:
    """The determinant of a 3 x 3 matrix (rule of Sarrus)."""
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def seed_spread(points: list[Point]) -> float | None:
    """The seed-to-seed standard deviation of one full-budget trial's loss (nats/char), pooled
    over the finite points that have two seeds or more; None without such a point."""
    return pooled_spread([points])


def pooled_spread(point_sets: list[list[Point]]) -> float | None:
    """The seed-to-seed standard deviation (nats/char) pooled over every finite point with two
    seeds or more in ``point_sets`` (e.g. every bracket of one dataset): the square root of the
    points' sample variances weighted by their degrees of freedom (seeds - 1); None without
    such a point. Two seeds give each point one degree of freedom, so one study's own spread
    rests on 3-7 of them and can come out several times too small by chance; a dataset's four
    studies together give 12-28."""
    finite = [p for points in point_sets for p in points
              if len(p.losses) > 1 and math.isfinite(p.loss)]
    if not finite:
        return None
    dof = sum(len(p.losses) - 1 for p in finite)
    squares = math.fsum((x - p.loss) ** 2 for p in finite for x in p.losses)
    return math.sqrt(squares / dof)


@dataclass(frozen=True)
class Uncertainty:
    """How much the chosen learning rate may cost, in nats/char: the ``median`` regret and its
    ``bound`` (the :data:`UNCERTAINTY_QUANTILE` quantile) over ``draws`` bootstrap draws, with
    the seed-to-seed ``spread`` they were drawn with."""

    median: float
    bound: float
    spread: float
    draws: int


def _regret(fit: Fit, lr: float) -> float:
    """How far above the minimum of ``fit``'s curve (or the best point) ``lr`` lies."""
    if fit.coefficients is None:
        return 0.0
    at = float(np.polyval(fit.coefficients, math.log(lr)))
    return max(0.0, at - fit.loss) if fit.used == "vertex" else max(0.0, at - min(
        float(np.polyval(fit.coefficients, math.log(x))) for x in fit.lrs))


def tuning_uncertainty(points: list[Point], chosen_lr: float, draws: int = BOOTSTRAP_DRAWS,
                       seed: int = BOOTSTRAP_SEED, spread: float | None = None
                       ) -> Uncertainty | None:
    """The regret of training at ``chosen_lr`` over a parametric bootstrap of ``points``'
    means (see the module docstring), drawn with ``spread`` (nats/char; default: the points'
    own, :func:`seed_spread`); None when the spread cannot be measured (one tuning seed) or
    fewer than three points are finite."""
    if spread is None:
        spread = seed_spread(points)
    finite = [p for p in points if math.isfinite(p.loss)]
    if spread is None or len(finite) < 3:
        return None
    rng = np.random.default_rng(seed)
    sems = np.array([spread / math.sqrt(len(p.losses)) for p in finite])
    means = np.array([p.loss for p in finite])
    regrets = []
    for noise in rng.standard_normal((draws, len(finite))):
        drawn = [Point(p.lr, (float(m),)) for p, m in zip(finite, means + noise * sems)]
        regrets.append(_regret(fit_minimum(drawn), chosen_lr))
    return Uncertainty(float(np.median(regrets)),
                       float(np.quantile(regrets, UNCERTAINTY_QUANTILE)), spread, draws)


def sensitivity(fit: Fit, factor: float = 2.0) -> float | None:
    """The fitted curve's excess loss (nats/char) at ``factor`` times or 1/``factor`` of the
    chosen lr, averaged: a * (ln factor)^2 for a vertex; None without a convex fit. A full-
    budget counterpart of the first rung's learning-rate sensitivity."""
    if fit.used != "vertex" or fit.coefficients is None:
        return None
    return float(fit.coefficients[0] * math.log(factor) ** 2)
