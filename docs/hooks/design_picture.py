"""The picture of docs/design.md: the floors of the package and three request flows through
them (a DRA claim to NVML, a label change to NVML, a scrape), each flow's files in order in the
row of their floor. Run `python docs/hooks/design_picture.py` after changing FLOORS or FLOWS;
tests/unit/test_design_picture.py checks that docs/img/design.svg is this script's output and
that every file named exists.

Plain SVG written here (no drawing library: the picture is boxes, text and arrows)."""

from __future__ import annotations

import itertools
import sys
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "img" / "design.svg"

FLOORS: tuple[tuple[int, str], ...] = (
    (12, "cli/"),
    (11, "agent/"),
    (10, "dra/"),
    (9, "kube/ | kubelet/"),
    (8, "reconcile/"),
    (7, "metrics/ | labels/"),
    (6, "sharing/ | planner/ | host/"),
    (5, "state/"),
    (4, "mig/ | mps/"),
    (3, "nvml/ | sim/"),
    (2, "settings/"),
    (1, "base/"),
)

# (title, where it comes from, where it ends, the files in order: (floor, file, what it does))
Flow = tuple[str, str, str, tuple[tuple[int, str, str], ...]]
FLOWS: tuple[Flow, ...] = (
    (
        "a DRA claim to NVML",
        "kubelet: NodePrepareResources (gRPC)",
        "NVML: create GPU instance",
        (
            (10, "dra/k8s/server.py", "the batch, the claim read"),
            (10, "dra/claims.py", "allocation -> claimed devices"),
            (10, "dra/prepared.py", "-> prepared devices"),
            (10, "dra/node.py", "prepare: a ClaimChange"),
            (8, "reconcile/pipeline.py", "run_change: the steps"),
            (8, "reconcile/claims.py", "owners checked, the plan"),
            (5, "state/owners.py", "the claim, preparing"),
            (8, "reconcile/change.py", "the one apply body"),
            (4, "mig/apply.py", "execute the plan"),
            (3, "nvml/write.py", "the MIG write"),
        ),
    ),
    (
        "a label change to NVML",
        "API server: a watch event of the Node",
        "NVML: create GPU instance",
        (
            (9, "kube/informer.py", "list, watch, relist"),
            (9, "kube/controller.py", "the label, once a version"),
            (11, "agent/service.py", "wake the reconcile"),
            (5, "state/workers.py", "the reconcile worker"),
            (8, "reconcile/pipeline.py", "run_once: the steps"),
            (4, "mig/plan.py", "the fewest operations"),
            (4, "mig/apply.py", "execute the plan"),
            (3, "nvml/write.py", "the MIG write"),
        ),
    ),
    (
        "a scrape",
        "Prometheus: GET /metrics",
        "the snapshot (no NVML call)",
        (
            (7, "metrics/server.py", "HTTP on one loop"),
            (7, "metrics/endpoints.py", "/metrics, negotiated"),
            (7, "metrics/exposition.py", "rendered once a version"),
            (7, "metrics/collectorset.py", "each collector, timed"),
            (5, "state/snapshot.py", "the store's latest"),
        ),
    ),
)

BOX = 38  # one step's box, with its gap
TOP = 70
LEFT = 20
FLOOR_W = 230
COL_W = 290
GAP = 16
COLOURS = ("#2f6fb0", "#b0602f", "#3f8f4f")


def _text(x: float, y: float, text: str, size: int = 13, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:g}" y="{y:g}" font-size="{size}"{extra}>{escape(text)}</text>'


def _rows() -> dict[int, tuple[float, float]]:
    """Each floor's (top, height): tall enough for the most steps one flow has on it."""
    out, y = {}, float(TOP)
    for floor, _ in FLOORS:
        most = max(sum(1 for f, _, _ in steps if f == floor) for *_, steps in FLOWS)
        height = max(1, most) * BOX + 8
        out[floor] = (y, height)
        y += height
    return out


def render() -> str:
    rows = _rows()
    bottom = max(top + height for top, height in rows.values())
    width = LEFT + FLOOR_W + GAP + len(FLOWS) * (COL_W + GAP)
    height = int(bottom) + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="sans-serif">',
        '<rect width="100%" height="100%" fill="white"/>',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"'
        ' fill="context-stroke"/></marker></defs>',
        _text(LEFT, 24, "floor, packages", 14, font_weight="bold"),
        _text(LEFT, 44, "(each imports only from below)", 12, fill="#444"),
    ]
    for i, (floor, packages) in enumerate(FLOORS):
        y, h = rows[floor]
        shade = "#f3f5f8" if i % 2 == 0 else "#ffffff"
        out.append(f'<rect x="{LEFT}" y="{y:g}" width="{width - 2 * LEFT}" height="{h:g}"'
                   f' fill="{shade}" stroke="#d8dde4"/>')  # fmt: skip
        out.append(_text(LEFT + 10, y + 24, f"{floor:>2}  {packages}", 14))
    for c, (title, source, sink, steps) in enumerate(FLOWS):
        x = LEFT + FLOOR_W + GAP + 10 + c * (COL_W + GAP)
        colour = COLOURS[c % len(COLOURS)]
        out.append(_text(x, 24, title, 14, font_weight="bold", fill=colour))
        out.append(_text(x, 44, source, 12, fill="#444"))
        used: dict[int, int] = {}
        boxes = []  # (top, bottom) of each step's box
        w = COL_W - 40
        for n, (floor, name, what) in enumerate(steps, 1):
            slot = used.get(floor, 0)
            used[floor] = slot + 1
            by = rows[floor][0] + 4 + slot * BOX
            h = BOX - 6
            out.append(f'<rect x="{x}" y="{by:g}" width="{w}" height="{h}" rx="5"'
                       f' fill="white" stroke="{colour}" stroke-width="1.5"/>')  # fmt: skip
            out.append(_text(x + 8, by + 14, f"{n}  {name}", 12, font_weight="bold"))
            out.append(_text(x + 8, by + 28, what, 11, fill="#444"))
            boxes.append((by, by + h))
        mid = x + w / 2
        ends = [(40.0, 52.0), *boxes, (bottom + 16, bottom + 30)]  # the source, the sink
        sides = [0, 0]  # routes taken so far on the left and the right: each its own lane
        for (t1, b1), (t2, b2) in itertools.pairwise(ends):
            between = [b for b in boxes if b1 <= b[0] and b[1] <= t2]
            if t2 >= b1 and not between:  # straight down
                out.append(_line([(mid, b1), (mid, t2)], colour))
            else:  # past other steps of the flow: along a side, down left, up right
                down = t2 >= b1
                lane = sides[0 if down else 1]
                sides[0 if down else 1] += 1
                side, edge = (x - 6 - 5 * lane, x) if down else (x + w + 8 + 5 * lane, x + w)
                y1, y2 = (t1 + b1) / 2, (t2 + b2) / 2
                if t1 < 52:  # from the source
                    out.append(_line([(side, b1), (side, y2), (edge, y2)], colour))
                else:
                    out.append(_line([(edge, y1), (side, y1), (side, y2), (edge, y2)], colour))
        out.append(_text(x, bottom + 34, sink, 12, fill="#444"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _line(points: list[tuple[float, float]], colour: str) -> str:
    path = " ".join(f"{x:g},{y:g}" for x, y in points)
    return (f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"'
            ' marker-end="url(#arrow)"/>')  # fmt: skip


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
