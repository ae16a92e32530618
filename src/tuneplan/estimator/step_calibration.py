"""Learning from real steps: per-mechanism corrections of the step time, fitted to measured step times.

A measured step time ``T`` says how far the predicted step is off, not which mechanism is. The correction
is a factor ``k_m`` per mechanism m (compute: the GEMM rate; memory_bound: the memory bandwidth;
communication: the GPU link; offload: the host link and the CPU optimizer; overhead: the CPU cost per
launch, per sharded unit and per micro-batch), applied to the rates inside the time model
(``RuntimeOptions.corrections``), so the overlap of communication with compute and the launch / work
rooflines are evaluated again with the corrected rates. The factors are the ones closest to 1, in units
of each mechanism's width (``time_band.py``: how well it is known), that explain the measurements. The
band holds a part between ``p / (1 + sigma_m)`` and ``p (1 + sigma_m)``, so the width in ``ln k`` is
``w_m = ln(1 + sigma_m)`` (``log_width``): 1.10 for an unstated PCIe link's 2.0. Taking 2.0 itself would
let a collective hidden behind compute at the measured shape take a whole difference with a large factor
and overshoot at a batch where it is not hidden (batch 4 -> batch 1 on a PCIe FSDP run). Each stored step
is predicted with the time options it was recorded with (a stated link), as the estimates it corrects are:

    minimize  sum_m (ln k_m / w_m)^2  +  sum_i ((T_i(k) - T_i) / (eps T_i))^2

(``eps`` = ``MEASURED_STEP_SPREAD``, the spread of a short run's step times), solved by Gauss-Newton on
``x = ln k`` with the step time's derivatives taken numerically. Where the step is a sum of parts
``p_m k_m`` the first step is the closed form ``x_m = w_m^2 p_m (T - P) / (sum_j w_j^2 p_j^2 +
(eps T)^2)``: the difference goes to the parts in proportion to ``w^2 p``, what is both large and
uncertain at the measured shape. A prediction at another batch then moves by the corrected mechanisms'
sizes there: a per-token part scales with the tokens, a fixed part (a gather over PCIe, the launches)
does not. Measurements at two or more shapes tell fixed from per-token parts apart.

The store is one JSON file in the user's config directory (``catalog.accelerators.config_dir``),
``calibration.json``: per ``card id | framework``, the measurements and the factors fitted to them when
they were stored (``measure/calibration.py`` writes it, atomically, never through a symbolic link).
Reading it here costs one ``stat`` per estimate while the file is unchanged.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from tuneplan.env_read import env_stamp
from tuneplan.estimator.time_band import PARTS

STORE_NAME = "calibration.json"
STORE_VERSION = 1
MEASURED_STEP_SPREAD = 0.03  # steps 2..N of a short run on one machine differ by a few percent
FACTOR_RANGE = (0.1, 10.0)  # a correction beyond 10x is a different setup, not a calibration
LABEL = "calibrated on this machine"

DERIVATIVE_STEP = 1e-3  # in ln k: a 0.1 % change of a rate
RECHECK_SECONDS = 1.0  # how stale the store read may be when another process changed it (this one: never)

_cache: dict[str, Any] = {}
_options: dict[Any, Any] = {}
# calibration_for's validated entries, by (card id, framework), for the store object under "store"
_entries: dict[Any, Any] = {}


# the variables the config folder is derived from (catalog.config_folder.config_dir)
PATH_VARIABLES = ("TUNEPLAN_CONFIG_DIR", "XDG_CONFIG_HOME", "HOME")


def store_path() -> str:
    """The store's path, for the environment as it is now (a change between two estimates is seen)."""
    return _store_path(env_stamp(PATH_VARIABLES))


@lru_cache(maxsize=8)
def _store_path(stamp: tuple[bytes | str | None, ...]) -> str:
    """The store's path for these environment values (every estimate asks: kept per ``env_stamp``)."""
    from tuneplan.catalog.accelerators import config_dir as user_config_dir

    return str(user_config_dir() / STORE_NAME)


def forget() -> None:
    """Read the store again at the next estimate (after this process wrote it)."""
    _cache.clear()
    _entries.clear()


def entry_key(card_id: str, framework: str) -> str:
    return f"{card_id}|{framework}"


def _kept_store() -> dict[str, Any]:
    store: dict[str, Any] = _cache["store"]
    return store


def load_store(path: str | None = None) -> dict[str, Any]:
    """The store's content (``{"version": 1, "entries": {key: {"measurements": [...]}}}``), empty when there
    is none or it cannot be read as one (a damaged store never stops an estimate)."""
    # the environment's stamp stands for the path it gives (store_path), read on every call
    environ = env_stamp(PATH_VARIABLES) if not path else None
    now = time.monotonic()
    # every estimate asks: the same environment within the interval is one comparison of its stamp
    fresh = _cache.get("fresh")
    if fresh is not None and fresh[0] == environ and now < fresh[1]:  # fresh[0] is never None
        store: dict[str, Any] = fresh[2]
        return store
    if environ is not None and _cache.get("environ") == environ:
        p = _cache["path"]
    else:
        p = path or _store_path(environ)
    if _cache.get("path") == p and now - _cache.get("checked", -1e9) < RECHECK_SECONDS:
        return _kept_store()  # an estimate grid asks thousands of times a second: one stat per interval
    store = _read_store(p, environ, now)
    # (environment's stamp, end of the interval, store): what the next call within it returns at once
    _cache["fresh"] = (environ, now + RECHECK_SECONDS, store) if environ is not None else None
    return store


def _read_store(p: str, environ: tuple[bytes | str | None, ...] | None, now: float) -> dict[str, Any]:
    """The store at ``p``, stat'ed now and read again when its time or size changed (kept in ``_cache``)."""
    try:
        st = os.stat(p)
    except OSError:
        _cache.update(path=p, environ=environ, checked=now, stamp=None,
                      store={"version": STORE_VERSION, "entries": {}})
        return _kept_store()
    _cache.update(path=p, environ=environ, checked=now)
    stamp = (p, st.st_mtime_ns, st.st_size)
    if _cache.get("stamp") == stamp:
        return _kept_store()
    try:
        with open(p, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise ValueError("not a calibration store")
    except (OSError, ValueError):
        data = {"version": STORE_VERSION, "entries": {}}
    _cache.update(stamp=stamp, store=data)
    return data


def log_width(sigma: float) -> float:
    """A mechanism's width in ``ln k``: the band puts its part between ``part / (1 + sigma)`` and
    ``part x (1 + sigma)`` (``time_band``), ``ln(1 + sigma)`` either side in log space."""
    return math.log1p(sigma)


def fit_corrections(cases: list[tuple[Callable[[dict[str, float]], float], float]], widths: dict[str, float],
                    iterations: int = 12) -> dict[str, float]:
    """Factors ``{mechanism: k}`` for ``cases`` = [(step time as a function of the factors, measured step
    seconds)], each mechanism's width in ``widths`` (see the module doc).

    Gauss-Newton with a Levenberg-Marquardt damping on ``x = ln k``. A mechanism hidden behind another at
    the measured shape (collectives overlapped by compute) has no slope at ``k = 1``, so the search also
    starts from each mechanism alone explaining the first measurement (found by bisection on its factor)
    and keeps the lowest objective."""
    parts = [p for p in PARTS if p in widths]
    if not parts or not cases:
        return {}

    def residuals(xs: list[float]) -> list[float]:
        k = {p: math.exp(v) for p, v in zip(parts, xs, strict=True)}
        prior = [v / log_width(widths[p]) for p, v in zip(parts, xs, strict=True)]
        return prior + [(f(k) - t) / (MEASURED_STEP_SPREAD * t) for f, t in cases]

    starts = [[0.0] * len(parts)]
    f0, t0 = cases[0]
    for j, p in enumerate(parts):
        v = _explaining(_alone(f0, p), t0)
        if v is not None:
            starts.append([math.log(v) if i == j else 0.0 for i in range(len(parts))])
    best = min((_gauss_newton(residuals, x, iterations) for x in starts), key=lambda xc: xc[1])[0]
    lo, hi = FACTOR_RANGE
    return {p: min(hi, max(lo, math.exp(v))) for p, v in zip(parts, best, strict=True)}


def _alone(step: Callable[[dict[str, float]], float], part: str) -> Callable[[float], float]:
    """The step time as a function of one mechanism's factor, the others at 1."""
    return lambda k: step({part: k})


def _explaining(step: Callable[[float], float], target: float) -> float | None:
    """The factor of one mechanism at which ``step`` reaches ``target`` (bisection in ln k over
    ``FACTOR_RANGE``; the step time grows with every factor), or None when none in the range does."""
    lo, hi = (math.log(v) for v in FACTOR_RANGE)
    if not step(math.exp(lo)) <= target <= step(math.exp(hi)):
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(math.exp(mid)) < target else (lo, mid)
    return math.exp((lo + hi) / 2)


def _gauss_newton(residuals: Callable[[list[float]], list[float]], x: list[float], iterations: int
                  ) -> tuple[list[float], float]:
    """(x, objective) after damped Gauss-Newton steps from ``x`` (numerical Jacobian)."""
    r = residuals(x)
    cost = sum(v * v for v in r)
    damping = 1e-3
    n = len(x)
    for _ in range(iterations):
        jac = []
        for j in range(n):
            xh = x[:]
            xh[j] += DERIVATIVE_STEP
            jac.append([(a - b) / DERIVATIVE_STEP for a, b in zip(residuals(xh), r, strict=True)])
        a_mat = [[sum(jac[i][q] * jac[j][q] for q in range(len(r))) + (damping if i == j else 0.0)
                  for j in range(n)] for i in range(n)]
        g = [-sum(jac[i][q] * r[q] for q in range(len(r))) for i in range(n)]
        dx = _solve(a_mat, g)
        trial = [v + d for v, d in zip(x, dx, strict=True)]
        r_trial = residuals(trial)
        c_trial = sum(v * v for v in r_trial)
        if c_trial < cost:
            x, r, cost, damping = trial, r_trial, c_trial, damping / 10
            if max(abs(d) for d in dx) < 1e-6:
                break
        else:
            damping *= 10
    return x, cost


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the damped normal matrix is positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= f * m[c][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][j] * x[j] for j in range(r + 1, n))) / m[r][r]
    return x


def calibration_for(card_id: str, framework: str, path: str | None = None) -> dict[str, Any] | None:
    """``{"factors": {mechanism: k}, "measurements": n, "shapes": distinct shapes}`` stored for the card and
    framework, or None when nothing was measured for them (a fresh dict per call: the caller may edit it).

    Every estimate with a card asks; the store's content is read at most once per ``RECHECK_SECONDS``
    (:func:`load_store`), and each entry's validated figures are kept for the store object they were read
    from (``_entries``: emptied when the store is read again), so an unchanged store costs a dict look-up."""
    store = load_store(path)
    if _entries.get("store") is not store:
        _entries.clear()
        _entries["store"] = store
    key = (card_id, framework)
    kept = _entries.get(key, _entries)  # _entries itself: not validated yet
    if kept is _entries:
        kept = _entries[key] = _entry_figures(store["entries"].get(entry_key(card_id, framework)))
    if kept is None:
        return None
    return {"factors": dict(kept["factors"]), "measurements": kept["measurements"], "shapes": kept["shapes"]}


def _entry_figures(entry: Any) -> dict[str, Any] | None:
    """An entry of the store as :func:`calibration_for` returns it, or None when it holds no usable
    factors (not a dict, a factor that is not a number or lies outside ``FACTOR_RANGE``)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("factors"), dict) or not entry["factors"]:
        return None
    try:
        factors = {str(k): float(v) for k, v in entry["factors"].items() if k in PARTS}
    except (TypeError, ValueError):
        return None
    lo, hi = FACTOR_RANGE
    if not factors or not all(lo <= v <= hi for v in factors.values()):
        return None
    ms = entry.get("measurements") or []
    shapes = {(m.get("batch"), m.get("seq"), m.get("grad_accum"), m.get("gpus"))
              for m in ms if isinstance(m, dict)}
    return {"factors": factors, "measurements": len(ms), "shapes": len(shapes)}


def corrected_options(options: Any, factors: dict[str, float]) -> Any:
    """``options`` (RuntimeOptions) with the factors as its corrections, one object per (options, factors)
    so the run's kept time terms match it."""
    key = (options, tuple(sorted(factors.items())))
    got = _options.get(key)
    if got is None:
        from dataclasses import replace

        got = _options[key] = replace(options, corrections=key[1])
    return got
