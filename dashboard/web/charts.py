"""Geometry for the SVG chart macros in templates/shared/_charts.html.

The macros draw (axes, labels, legend, titles); this turns buckets into the `d` attribute of one
path per layer. Done here, not in Jinja: the overview draws a hundred sparklines on every poll, and
building a few thousand numbers in template code would cost most of the page.
"""

from __future__ import annotations

# Each chart is also drawn this wide, for a phone: a 400 px screen shows it at its own scale, so its 10 px labels
# stay 10 px (a 760 px chart shrunk to fit would draw them at 5 px).
COMPACT_WIDTH = 340


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


# A 10 px tick label's width per character, generously: what keeps a label inside the chart.
TICK_CHAR_PX = 6.2


def x_ticks(buckets, label_every: int, label_format: str, width: float, left: float, step: float,
            right_edge: float) -> list[tuple[float, str, str]]:
    """(x, text, anchor) of the time labels every `label_every` buckets. A label that would run past the
    plot's right edge is anchored at its end instead, so no label is ever clipped."""
    out = []
    for i in range(0, len(buckets), max(label_every, 1)):
        x = round(left + i * step, 2)
        label = buckets[i].start.strftime(label_format)
        if x + 2 + len(label) * TICK_CHAR_PX > right_edge:
            out.append((x, label, "end"))
        else:
            out.append((x + 2, label, "start"))
    return out


def line_paths(lines, width: float, height: float, left: float = 0, top: float = 0) -> dict:
    """One polyline per series of `lines`, (values, label, css class) with None for no value (the line
    breaks there), all on one scale whose top is the largest value. Returns {"peak": largest value,
    css class: path data, ...}; each point sits in the middle of its bucket, as the bars do."""
    peak = max((v for values, *_ in lines for v in values if v is not None), default=0)
    scale = height / (peak or 1)
    out = {"peak": peak}
    for values, _, name in lines:
        step = width / max(len(values), 1)
        parts, drawing = [], False
        for i, value in enumerate(values):
            if value is None:
                drawing = False
                continue
            x, y = left + (i + 0.5) * step, top + height - value * scale
            # h0 after a move: with round caps, a point alone between gaps still shows as a dot.
            parts.append(f"L{x:.4g} {y:.4g}" if drawing else f"M{x:.4g} {y:.4g}h0")
            drawing = True
        out[name] = "".join(parts)
    return out
