"""Draws docs/img/dataflow.svg, the data flow of docs/architecture.md, from the table below.

Run it after changing the table: ``python docs/img/dataflow.py`` (the standard library only;
tests/test_docs_dataflow.py checks that the committed picture is what it writes).

Each stage is a box on a grid (row, column), with its name, where it lives and what it
does; ``FLOW`` is the path of a batch from box to box, ``ALSO`` the other arrows (dashed).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_suffix(".svg")


@dataclass(frozen=True)
class Stage:
    row: int
    column: int
    title: str
    where: str  # the package or module, as docs/architecture.md names it
    what: tuple[str, ...]  # one or two short lines
    kind: str  # a colour of KINDS


# The stages, their place on the grid, and what each does.
STAGES: dict[str, Stage] = {
    "sampler": Stage(0, 0, "sampler", "samplers/", ("keys, sync or async",), "vocabulary"),
    "batches": Stage(0, 1, "batch sampler", "samplers/batch.py", ("lists of keys",), "vocabulary"),
    "scheduler": Stage(
        0, 2, "scheduler", "pipeline/scheduler.py", ("numbers batches,", "the window"), "pipeline"
    ),
    "backend": Stage(
        0, 3, "backend", "backends/", ("inline, processes", "or an executor"), "backends"
    ),
    "reader": Stage(
        0,
        4,
        "batch reader",
        "read/reader.py",
        ("fetch, faults/, collate/", "→ one Outcome"),
        "read",
    ),
    "dataset": Stage(
        1, 4, "dataset", "data/  sources/", ("map-style or stream,", "sync or async"), "vocabulary"
    ),
    "transport": Stage(
        1, 3, "transport", "memory/segments.py", ("shared memory, back", "from workers"), "memory"
    ),
    "reorder": Stage(
        1,
        2,
        "reorder",
        "pipeline/scheduler.py",
        ("by number, unless", "in_order=False"),
        "pipeline",
    ),
    "pin": Stage(
        1, 1, "pin", "pipeline/pin_stage.py", ("a thread;", "memory/pinned.py"), "pipeline"
    ),
    "consumer": Stage(
        1, 0, "consumer", "pipeline/iteration.py", ("async for, or for", "(a loop thread)"), "face"
    ),
}

# The path of a batch.
FLOW: tuple[str, ...] = (
    "sampler",
    "batches",
    "scheduler",
    "backend",
    "reader",
    "transport",
    "reorder",
    "pin",
    "consumer",
)

# Other arrows: (from, to, label).
ALSO: tuple[tuple[str, str, str], ...] = (
    ("dataset", "reader", "read"),
    ("consumer", "scheduler", "frees its window slot"),
)

KINDS = {  # fill, border
    "face": ("#fde2e4", "#c9184a"),
    "pipeline": ("#dbe9ff", "#1d4ed8"),
    "backends": ("#ffedd5", "#c2410c"),
    "read": ("#dcfce7", "#15803d"),
    "memory": ("#ede9fe", "#6d28d9"),
    "vocabulary": ("#f1f5f9", "#475569"),
}

BOX_WIDTH, BOX_HEIGHT = 168, 92
GAP_X, GAP_Y = 34, 64
MARGIN = 16
TEXT = "#0f172a"
MUTED = "#475569"
ARROW = "#334155"


def _box(stage: Stage) -> tuple[float, float]:
    """The top-left corner of a stage's box."""
    x = MARGIN + stage.column * (BOX_WIDTH + GAP_X)
    y = MARGIN + stage.row * (BOX_HEIGHT + GAP_Y)
    return x, y


def _centre(stage: Stage) -> tuple[float, float]:
    x, y = _box(stage)
    return x + BOX_WIDTH / 2, y + BOX_HEIGHT / 2


def _edge(stage: Stage, towards: tuple[float, float], pad: float) -> tuple[float, float]:
    """Where the line from a box's centre towards a point leaves the box (plus ``pad``)."""
    cx, cy = _centre(stage)
    dx, dy = towards[0] - cx, towards[1] - cy
    scale = min(
        (BOX_WIDTH / 2 + pad) / abs(dx) if dx else math.inf,
        (BOX_HEIGHT / 2 + pad) / abs(dy) if dy else math.inf,
    )
    return cx + dx * scale, cy + dy * scale


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _arrow(start: Stage, end: Stage, label: str = "", dashed: bool = False) -> list[str]:
    a = _edge(start, _centre(end), 2)
    b = _edge(end, _centre(start), 6)
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    out = [
        f'<line x1="{_number(a[0])}" y1="{_number(a[1])}" x2="{_number(b[0])}" '
        f'y2="{_number(b[1])}" stroke="{ARROW}" stroke-width="1.6"{dash} '
        'marker-end="url(#head)"/>'
    ]
    if label:
        mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
        out.append(
            f'<text x="{_number(mx + 8)}" y="{_number(my - 6)}" font-size="12" '
            f'fill="{MUTED}" font-style="italic">{escape(label)}</text>'
        )
    return out


def _stage(stage: Stage) -> list[str]:
    x, y = _box(stage)
    fill, border = KINDS[stage.kind]
    cx = x + BOX_WIDTH / 2
    out = [
        f'<rect x="{_number(x)}" y="{_number(y)}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" '
        f'rx="8" fill="{fill}" stroke="{border}" stroke-width="1.5"/>',
        f'<text x="{_number(cx)}" y="{_number(y + 22)}" text-anchor="middle" font-size="15" '
        f'font-weight="bold" fill="{TEXT}">{escape(stage.title)}</text>',
        f'<text x="{_number(cx)}" y="{_number(y + 41)}" text-anchor="middle" font-size="12" '
        f'font-family="monospace" fill="{border}">{escape(stage.where)}</text>',
    ]
    for i, line in enumerate(stage.what):
        out.append(
            f'<text x="{_number(cx)}" y="{_number(y + 61 + 16 * i)}" text-anchor="middle" '
            f'font-size="12" fill="{MUTED}">{escape(line)}</text>'
        )
    return out


def render() -> str:
    """The picture, as SVG text (the same text for the same table, byte for byte)."""
    columns = 1 + max(stage.column for stage in STAGES.values())
    rows = 1 + max(stage.row for stage in STAGES.values())
    width = 2 * MARGIN + columns * BOX_WIDTH + (columns - 1) * GAP_X
    height = 2 * MARGIN + rows * BOX_HEIGHT + (rows - 1) * GAP_Y
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" role="img" '
        'aria-label="How a batch flows through aioload">',
        "<defs>",
        '<marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        f'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        f'fill="{ARROW}"/></marker>',
        "</defs>",
        f'<rect width="{width}" height="{height}" rx="10" fill="#ffffff"/>',
    ]
    for name in STAGES:
        lines += _stage(STAGES[name])
    for start, end in itertools.pairwise(FLOW):
        lines += _arrow(STAGES[start], STAGES[end])
    for start, end, label in ALSO:
        lines += _arrow(STAGES[start], STAGES[end], label, dashed=True)
    lines.append("</svg>")
    return "\n".join(lines) + "\n"


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT.name}")


if __name__ == "__main__":
    main()
