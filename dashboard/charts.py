"""Geometry for the SVG chart macros in templates/shared/_charts.html.

The macros draw (axes, labels, legend, titles); this turns buckets into the `d` attribute of one
path per layer. Done here, not in Jinja: the overview draws a hundred sparklines on every poll, and
building a few thousand numbers in template code cost most of the page.
"""

from __future__ import annotations


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def bar_paths(buckets, layers: list[str], width: float, height: float, left: float = 0, top: float = 0,
              overlay: str | None = None) -> dict:
    """Stacked bars, one per bucket, bottom to top in `layers` order (attribute names of the buckets), scaled
    so the tallest bar fills `height`. Returns {"peak": tallest total, layer: path data, ..., "overlay": path
    data of `overlay` drawn down from each bar's top (a part of the top layer, like dead letters of failures)}."""
    totals = [sum(getattr(b, name) for name in layers) for b in buckets]
    peak = max(totals, default=0) or 1
    step = width / max(len(buckets), 1)
    bar = _fmt(max(step - 1, 1))
    scale = height / peak
    paths = {name: [] for name in layers}
    on_top = []
    for i, (b, total) in enumerate(zip(buckets, totals)):
        if not total:
            continue
        x = _fmt(left + i * step + 0.5)
        base = top + height
        for name in layers:
            h = getattr(b, name) * scale
            if h:
                paths[name].append(f"M{x} {_fmt(base - h)}h{bar}v{_fmt(h)}h-{bar}z")
                base -= h
        if overlay and getattr(b, overlay):
            on_top.append(f"M{x} {_fmt(base)}h{bar}v{_fmt(getattr(b, overlay) * scale)}h-{bar}z")
    out = {name: "".join(parts) for name, parts in paths.items()}
    out["overlay"] = "".join(on_top)
    out["peak"] = max(totals, default=0)
    return out
