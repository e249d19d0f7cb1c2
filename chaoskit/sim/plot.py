"""Goodput against checkpoint interval as a self-contained SVG (hand-written, no matplotlib).

The curve is the exact closed form; dots with whiskers are Monte Carlo
estimates (95% intervals) at a few intervals; vertical lines mark Young's and
Daly's optima and the interval in use. The x axis is logarithmic.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

import numpy as np

from chaoskit.sim.model import ClusterModel, goodput

__all__ = ["goodput_svg", "interval_range", "format_span"]

_W, _H = 760, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 24, 48, 64
_COLOURS = {"curve": "#1f6feb", "mc": "#d1242f", "young": "#8250df", "daly": "#1a7f37", "yours": "#6e7781"}


def goodput_svg(model: ClusterModel, markers: dict[str, float], mc_points: Sequence[tuple[float, float, float, float]] = (),
                title: str | None = None) -> str:
    """Return the SVG text.

    ``markers`` maps ``"young"``, ``"daly"`` and ``"yours"`` to intervals in
    seconds (a marker at 0 or below is listed in the legend, not drawn);
    ``mc_points`` are ``(interval_s, mean, low, high)``.
    """
    lo_x, hi_x = interval_range(markers.values(), [p[0] for p in mc_points])
    xs = np.exp(np.linspace(math.log(lo_x), math.log(hi_x), 240))
    ys = np.asarray(goodput(model, xs), dtype=float)
    y_values = list(ys) + [p[2] for p in mc_points] + [p[3] for p in mc_points]
    top = max(y_values)
    # Show the top of the curve, where the choice matters, not the collapse at the ends.
    bottom = max(min(y_values), top - max(0.25, 3 * (top - float(np.median(ys)))))
    lo_y, hi_y = _nice_floor(bottom), _nice_ceil(top)

    def px(x: float) -> float:
        return _LEFT + (math.log(x) - math.log(lo_x)) / (math.log(hi_x) - math.log(lo_x)) * (_W - _LEFT - _RIGHT)

    def py(y: float) -> float:
        y = min(max(y, lo_y), hi_y)
        return _H - _BOTTOM - (y - lo_y) / (hi_y - lo_y) * (_H - _TOP - _BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        'font-family="system-ui, sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_LEFT}" y="22" font-size="15" font-weight="bold">{escape(title or "Goodput against checkpoint interval")}</text>',
        f'<text x="{_LEFT}" y="38" fill="#57606a">{escape(_subtitle(model))}</text>',
    ]
    # Axes, grid and ticks.
    for y in _ticks(lo_y, hi_y):
        out.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eaeef2"/>')
        out.append(f'<text x="{_LEFT - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{y * 100:.{_decimals(hi_y - lo_y)}f}%</text>')
    for x in _log_ticks(lo_x, hi_x):
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}" stroke="#eaeef2"/>')
        out.append(f'<text x="{px(x):.1f}" y="{_H - _BOTTOM + 18}" text-anchor="middle">{format_span(x)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{_W - _LEFT - _RIGHT}" height="{_H - _TOP - _BOTTOM}" fill="none" stroke="#8c959f"/>')
    x_label = "checkpoint interval (compute time between checkpoints, log scale)"
    out.append(f'<text x="{(_LEFT + _W - _RIGHT) / 2}" y="{_H - 22}" text-anchor="middle">{x_label}</text>')
    y_label = "goodput (effective training time)"
    out.append(f'<text transform="translate(18 {(_TOP + _H - _BOTTOM) / 2}) rotate(-90)" text-anchor="middle">{y_label}</text>')

    # The exact curve.
    points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
    out.append(f'<polyline id="goodput-curve" points="{points}" fill="none" stroke="{_COLOURS["curve"]}" stroke-width="2"/>')

    # Optima and the interval in use, then a legend in the empty space under the peak.
    dashes = {"young": "6 4", "daly": "2 3", "yours": "1 0"}
    labels = {"young": "Young sqrt(2CM)", "daly": "Daly (higher order)", "yours": "your interval"}
    legend: list[tuple[str, str, str]] = []  # (kind, colour or dash, text)
    for key in ("young", "daly", "yours"):
        if key not in markers:
            continue
        x = markers[key]
        text = f"{labels[key]}: {format_span(x)}" if x > 0 else f"{labels[key]}: 0 (free checkpoints)"
        if x > 0:
            g = float(goodput(model, x))
            text += f", {g * 100:.2f}%"
            out.append(
                f'<line id="marker-{key}" x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}" '
                f'stroke="{_COLOURS[key]}" stroke-width="1.5" stroke-dasharray="{dashes[key]}"/>'
            )
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(g):.1f}" r="3.5" fill="{_COLOURS[key]}"/>')
        legend.append(("line", key, text))

    if mc_points:
        out.append('<g id="monte-carlo">')
        for x, mean, low, high in mc_points:
            out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(low):.1f}" y2="{py(high):.1f}" stroke="{_COLOURS["mc"]}"/>')
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(mean):.1f}" r="2.5" fill="{_COLOURS["mc"]}"/>')
        out.append("</g>")
        legend.append(("dot", "mc", "Monte Carlo, 95% interval"))
    legend.append(("line", "curve", "closed form (exact)"))

    box_w, box_h = 250, 16 * len(legend) + 10
    bx = (_LEFT + _W - _RIGHT) / 2 - box_w / 2
    by = _H - _BOTTOM - box_h - 10
    out.append(f'<g id="legend"><rect x="{bx:.1f}" y="{by:.1f}" width="{box_w}" height="{box_h}" fill="white" fill-opacity="0.9" stroke="#d0d7de"/>')
    for i, (kind, key, text) in enumerate(legend):
        y = by + 18 + 16 * i
        if kind == "dot":
            out.append(f'<circle cx="{bx + 22:.1f}" cy="{y - 4:.1f}" r="2.5" fill="{_COLOURS[key]}"/>')
        else:
            dash = dashes.get(key, "1 0")
            width = 2 if key == "curve" else 1.5
            out.append(f'<line x1="{bx + 10:.1f}" x2="{bx + 34:.1f}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{_COLOURS[key]}" '
                       f'stroke-width="{width}" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{bx + 42:.1f}" y="{y:.1f}">{escape(text)}</text>')
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def interval_range(markers, extra=()) -> tuple[float, float]:
    """The x range that shows every positive marker with room on both sides."""
    positive = [v for v in list(markers) + list(extra) if v > 0]
    if not positive:
        return 1.0, 3600.0
    return min(positive) / 4.0, max(positive) * 4.0


def format_span(seconds: float) -> str:
    """Short human duration for labels: ``45s``, ``12m``, ``3.1h``, ``54d``."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            v = seconds / size
            return f"{v:.0f}{unit}" if v >= 10 or abs(v - round(v)) < 0.05 else f"{v:.1f}{unit}"
    return f"{seconds:.0f}s"


def _subtitle(model: ClusterModel) -> str:
    from chaoskit.sim.model import recovery_stats

    return (
        f"{model.gpus:,} GPUs, cluster MTBF {format_span(model.cluster_mtbf_s)}, "
        f"checkpoint cost {format_span(model.ckpt_cost_s) if model.ckpt_cost_s else '0s'}, "
        f"MTTR {format_span(recovery_stats(model).mean_s)}"
    )


def _nice_floor(v: float) -> float:
    step = _step(v)
    return math.floor(v / step) * step


def _nice_ceil(v: float) -> float:
    return min(1.0, math.ceil(v / _step(v) - 1e-9) * _step(v)) if v < 1 else 1.0


def _step(v: float) -> float:
    return 0.01 if v > 0.8 else 0.05


def _ticks(lo: float, hi: float) -> list[float]:
    span = hi - lo
    step = next(s for s in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25) if span / s <= 8)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 6) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _decimals(span: float) -> int:
    return 1 if span < 0.1 else 0


def _log_ticks(lo: float, hi: float) -> list[float]:
    nice = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400]
    ticks = [t for t in nice if lo <= t <= hi]
    if len(ticks) > 9:
        ticks = ticks[:: math.ceil(len(ticks) / 9)]
    return ticks
