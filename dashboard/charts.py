"""Geometry for the SVG chart macros in templates/shared/_charts.html.

The macros draw (axes, labels, legend, titles); this turns buckets into the `d` attribute of one
path per layer. Done here, not in Jinja: the overview draws a hundred sparklines on every poll, and
building a few thousand numbers in template code cost most of the page.
"""

from __future__ import annotations


def bar_paths(buckets, layers: list[str], width: float, height: float, left: float = 0, top: float = 0,
              overlay: str | None = None) -> dict:
    """Stacked bars, one per bucket, bottom to top in `layers` order (attribute names of the buckets), scaled
    so the tallest bar fills `height`. Returns {"peak": tallest total, "totals": {layer: sum over the buckets},
    layer: path data, ..., "overlay": path data of `overlay` drawn down from each bar's top (a part of the top
    layer, like dead letters of failures)}. Coordinates have 4 significant digits: a tenth of a pixel at most."""
    rows = [[getattr(b, name) for name in layers] for b in buckets]
    totals = [sum(row) for row in rows]
    peak = max(totals, default=0) or 1
    step = width / max(len(buckets), 1)
    bar = f"{max(step - 1, 1):.4g}"
    scale = height / peak
    paths = {name: [] for name in layers}
    on_top = []
    for i, (b, row, total) in enumerate(zip(buckets, rows, totals)):
        if not total:
            continue
        x = f"{left + i * step + 0.5:.4g}"
        base = top + height
        for name, value in zip(layers, row):
            if value:
                h = value * scale
                paths[name].append(f"M{x} {base - h:.4g}h{bar}v{h:.4g}h-{bar}z")
                base -= h
        if overlay and getattr(b, overlay):
            on_top.append(f"M{x} {base:.4g}h{bar}v{getattr(b, overlay) * scale:.4g}h-{bar}z")
    out = {name: "".join(parts) for name, parts in paths.items()}
    out["overlay"] = "".join(on_top)
    out["peak"] = max(totals, default=0)
    out["totals"] = {name: sum(row[i] for row in rows) for i, name in enumerate(layers)}
    return out
