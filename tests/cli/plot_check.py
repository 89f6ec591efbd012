"""Checks `ft plot`'s pictures for tests/cli/test_plot.sh (not a test itself). Debian's python3
alone: xml.etree for the SVG, zlib and struct for PNGs (no PIL).

    plot_check.py svg FILE.svg SMOOTH RUN_OR_FILE...   # RUN_OR_FILE in the order given to ft plot
    plot_check.py png FILE.png WIDTH HEIGHT [--svg FILE.svg]

svg: the SVG is well-formed XML; every panel with data in some run is there, and no other;
each run's curve of each metric is a polyline whose points, inverted through its panel's
transform (data-x0/x1/y0/y1 at data-px0/px1/py0/py1, data-log-y), are metrics.jsonl's values
(the last line of a step counting, per kind of line; nulls no point), at exactly its steps, within
what the SVG's two decimals of a pixel allow; the smoothed loss is TensorBoard's debiased EMA of
them at weight SMOOTH, computed here.
png: the file decodes (signature, chunk CRCs, IHDR, IDAT inflated and unfiltered) to WIDTH x
HEIGHT and is not one colour. With --svg (a render of that SVG, e.g. by rsvg-convert), each
run's colour is drawn inside the loss panel's box, scaled to the render's size.
"""

import json
import math
import os
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

SVG = "{http://www.w3.org/2000/svg}"
# Panel -> metrics it draws and their scale (memory in GiB), as lib/train/plot.cpp's panel table.
PANELS = {"loss": {"loss": 1, "eval_loss": 1}, "lr": {"lr": 1}, "tokens_per_s": {"tokens_per_s": 1},
          "tflops": {"tflops": 1}, "grad_norm": {"grad_norm": 1},
          "memory": {"mem_peak_bytes": 1 / 2**30}}
# Tableau 10, in run order (plot.cpp kRunColors).
COLORS = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28)]
# The SVG writes pixels with two decimals: a point is off by at most 0.005 px on each axis; 0.006
# leaves room for the value range's own rounding (the transform is written with 17 digits).
PIXEL_TOL = 0.006


def metrics(path):
    """{key: {step: value}} of a metrics file, DESIGN.md §7: per kind of line (step, eval,
    checkpoint) the last line of a step counts; null is no value. A last line cut short without
    a newline is left out, as ft plot does."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    text = open(path).read()
    lines = text.split("\n")
    kinds = {"step": {}, "eval": {}}
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            j = json.loads(line)
        except ValueError:
            assert n == len(lines) - 1, f"{path}:{n + 1} is not JSON"  # the cut-short last line
            continue
        kind = "eval" if "eval_loss" in j else "ckpt" if "ckpt_step" in j else "step"
        if kind != "ckpt":
            kinds[kind][j["step"]] = j
    out = {}
    for kind, lines in kinds.items():
        for step, j in lines.items():
            for k, v in j.items():
                if kind == "eval" and not k.startswith("eval_"):
                    continue  # ft plot draws evaluation lines' eval_ keys only
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out.setdefault(k, {})[step] = float(v)
    return out


def ema(points, w):
    """TensorBoard's smoothing: debiased exponential moving average, by point."""
    out, m = [], 0.0
    for i, (s, v) in enumerate(points, 1):
        m = w * m + (1 - w) * v
        out.append((s, m / (1 - w**i)))
    return out


def check_svg(svg_path, smooth, runs):
    root = ET.parse(svg_path).getroot()  # raises on a document that is not well-formed
    assert root.tag == SVG + "svg", root.tag
    want = [metrics(r) for r in runs]
    panels = {g.get("data-panel"): g for g in root.iter(SVG + "g") if g.get("class") == "panel"}
    with_data = {p for p, keys in PANELS.items() if any(k in m for m in want for k in keys)}
    assert set(panels) == with_data, (sorted(panels), sorted(with_data))
    checked = 0
    for name, g in panels.items():
        t = {k: float(g.get("data-" + k)) for k in ("x0", "x1", "y0", "y1", "px0", "px1", "py0",
                                                   "py1")}
        log_y = g.get("data-log-y") == "1"
        fy = math.log10 if log_y else (lambda v: v)
        dx = (t["x1"] - t["x0"]) / (t["px1"] - t["px0"])  # value per pixel
        dy = (fy(t["y1"]) - fy(t["y0"])) / (t["py1"] - t["py0"])

        def invert(px, py):
            y = fy(t["y0"]) + (py - t["py0"]) * dy
            return t["x0"] + (px - t["px0"]) * dx, (10**y if log_y else y)

        drawn = {}
        for pl in g.iter(SVG + "polyline"):
            if pl.get("data-metric") is None:
                continue  # grid lines
            key = (int(pl.get("data-run")), pl.get("data-metric"), pl.get("data-kind"))
            assert key not in drawn, f"{name}: {key} drawn twice"
            drawn[key] = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
        expected = {}
        for r, m in enumerate(want):
            for key, scale in PANELS[name].items():
                if key not in m:
                    continue
                points = sorted((s, v * scale) for s, v in m[key].items())
                if key == "eval_loss":
                    expected[(r, key, "eval")] = points
                elif name == "loss":
                    expected[(r, key, "raw")] = points
                    expected[(r, key, "smoothed")] = ema(points, smooth)
                else:
                    expected[(r, key, "raw")] = points
        assert set(drawn) == set(expected), (name, sorted(drawn), sorted(expected))
        for key, points in expected.items():
            got = [invert(px, py) for px, py in drawn[key]]
            assert len(got) == len(points), (name, key, len(got), len(points))
            for (x, y), (s, v) in zip(got, points):
                assert abs(x - s) <= PIXEL_TOL * abs(dx), (name, key, x, s)
                if log_y:  # PIXEL_TOL of a pixel in log10 units: a relative bound
                    ok = abs(math.log10(y) - math.log10(v)) <= PIXEL_TOL * abs(dy)
                else:
                    ok = abs(y - v) <= PIXEL_TOL * abs(dy)
                assert ok, (name, key, s, y, v, dy)
                checked += 1
    labels = {pl.get("data-run"): pl.get("data-label") for pl in root.iter(SVG + "polyline")
              if pl.get("data-run") is not None}
    print(f"svg: {len(panels)} panels ({', '.join(sorted(panels))}), {checked} drawn points equal "
          f"to metrics.jsonl; labels {dict(sorted(labels.items()))}")
    return root


def read_png(path):
    """(width, height, rows of (r, g, b, a) tuples) of an 8-bit RGB or RGBA PNG, not
    interlaced: the kinds cairo and rsvg-convert write."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    at, idat, ihdr = 8, b"", None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        assert struct.unpack(">I", data[at + 8 + n:at + 12 + n])[0] == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        at += 12 + n
    width, height, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    bpp = 4 if color == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    assert len(raw) == height * (stride + 1), (len(raw), height, stride)
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # the five filters of the PNG specification, section 9
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            else:
                assert f == 0, f"row {y}: filter {f}"
        prev = line
        px = [tuple(line[i:i + bpp]) + ((255,) if bpp == 3 else ()) for i in range(0, stride, bpp)]
        rows.append(px)
    return width, height, rows


def check_png(path, width, height, svg_path=None):
    w, h, rows = read_png(path)
    assert (w, h) == (width, height), ((w, h), (width, height))
    colors = {p for row in rows for p in row}
    white = sum(row.count((255, 255, 255, 255)) for row in rows)
    assert len(colors) > 10, f"{len(colors)} colours: blank"
    assert white < 0.98 * w * h, f"{white} of {w * h} pixels white: blank"
    print(f"png {os.path.basename(path)}: {w}x{h}, {len(colors)} colours, "
          f"{100 - 100 * white / (w * h):.1f}% not white")
    if not svg_path:
        return
    root = ET.parse(svg_path).getroot()
    sx, sy = w / float(root.get("width")), h / float(root.get("height"))
    g = next(g for g in root.iter(SVG + "g") if g.get("data-panel") == "loss")
    runs = sorted({int(p.get("data-run")) for p in g.iter(SVG + "polyline") if p.get("data-run")})
    x0, x1 = sorted(float(g.get(k)) * sx for k in ("data-px0", "data-px1"))
    y0, y1 = sorted(float(g.get(k)) * sy for k in ("data-py0", "data-py1"))
    for r in runs:
        want = COLORS[r]
        near = sum(1 for y in range(int(y0) + 1, int(y1)) for p in rows[y][int(x0) + 1:int(x1)]
                   if max(abs(p[i] - want[i]) for i in range(3)) <= 40)
        assert near >= 20, f"run {r}'s colour {want}: {near} pixels in the loss panel"
        print(f"  run {r}'s colour #{bytes(want).hex()}: {near} pixels in the loss panel")


if __name__ == "__main__":
    if sys.argv[1] == "svg":
        check_svg(sys.argv[2], float(sys.argv[3]), sys.argv[4:])
    else:
        svg = sys.argv[sys.argv.index("--svg") + 1] if "--svg" in sys.argv else None
        check_png(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), svg)
