"""A workflow's DAG as server-side SVG: steps as linked nodes with status and progress, edges between them.

Layout: a step's row is its depth (0 without dependencies, else one more than its deepest
dependency), so edges always point down; a row's steps stand side by side in creation order, centred.
No script and no inline style (the CSP forbids both): colours come from classes in ``app.css``.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from markupsafe import Markup

from ..gateway import StepView, WorkflowView

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 150, 50, 16, 34, 8


def _depths(steps: tuple[StepView, ...]) -> dict[str, int]:
    by_name = {s.name: s for s in steps}
    depth: dict[str, int] = {}

    def visit(name: str, seen: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        step = by_name.get(name)
        parents = [d for d in (step.depends_on if step else ()) if d in by_name and d not in seen]
        depth[name] = 1 + max((visit(d, seen | {name}) for d in parents), default=-1)
        return depth[name]

    for s in steps:
        visit(s.name, frozenset())
    return depth


def dag_svg(workflow: WorkflowView, href: Callable[[str], str]) -> Markup:
    """The SVG of *workflow*; *href* gives a step job's page from its id."""
    depth = _depths(workflow.steps)
    rows: dict[int, list[StepView]] = {}
    for s in workflow.steps:
        rows.setdefault(depth[s.name], []).append(s)
    widest = max(len(r) for r in rows.values())
    width = PAD * 2 + widest * NODE_W + (widest - 1) * GAP_X
    height = PAD * 2 + len(rows) * NODE_H + (len(rows) - 1) * GAP_Y
    at: dict[str, tuple[float, float]] = {}
    for d, row in rows.items():
        row_w = len(row) * NODE_W + (len(row) - 1) * GAP_X
        x0 = (width - row_w) / 2
        for i, s in enumerate(row):
            at[s.name] = (x0 + i * (NODE_W + GAP_X), PAD + d * (NODE_H + GAP_Y))
    edges = []
    for s in workflow.steps:
        x, y = at[s.name]
        for dep in s.depends_on:
            if dep not in at:
                continue
            dx, dy = at[dep]
            x1, y1, x2, y2 = dx + NODE_W / 2, dy + NODE_H, x + NODE_W / 2, y - 4
            mid = (y1 + y2) / 2
            edges.append(
                f'<path class="edge" data-edge="{escape(dep)}→{escape(s.name)}" '
                f'd="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}" '
                'marker-end="url(#dag-arrow)"/>'
            )
    nodes = [_node(s, *at[s.name], href) for s in workflow.steps]
    return Markup(
        f'<svg class="dag" viewBox="0 0 {width} {height}" width="{width}" role="img" '
        f'aria-label="Workflow steps and their dependencies">'
        '<defs><marker id="dag-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path class="arrow" d="M0,0 L8,4 L0,8 z"/></marker></defs>'
        f"{''.join(edges)}{''.join(nodes)}</svg>"
    )


def _node(s: StepView, x: float, y: float, href: Callable[[str], str]) -> str:
    job = s.job
    failed = job.status in ("failed", "interrupted")
    fraction = 1.0 if job.status == "succeeded" else min(1.0, max(0.0, job.progress or 0.0))
    label = ("✕ " if failed else "") + s.name
    state = job.status + (f" · {round(fraction * 100)}%" if job.status == "running" else "")
    state += " · reused" if s.reused else ""
    tip = f"{s.name}: {job.status}" + (f", {round(fraction * 100)}%" if job.progress is not None else "")
    tip += f" — {job.summary}" if job.summary else ""
    tip += f" — {job.error}" if failed and job.error else ""
    bar_w = (NODE_W - 16) * fraction
    return (
        f'<a href="{escape(href(job.id))}" class="node s-{escape(job.status)}{" failed" if failed else ""}" '
        f'data-step="{escape(s.name)}" data-status="{escape(job.status)}">'
        f"<title>{escape(tip)}</title>"
        f'<rect class="box" x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="7"/>'
        f'<text class="name" x="{x + 8:.1f}" y="{y + 17:.1f}">{escape(_fit(label, 19))}</text>'
        f'<text class="state" x="{x + 8:.1f}" y="{y + 32:.1f}">{escape(state)}</text>'
        f'<rect class="track" x="{x + 8:.1f}" y="{y + 39:.1f}" width="{NODE_W - 16}" height="5" rx="2"/>'
        f'<rect class="bar" x="{x + 8:.1f}" y="{y + 39:.1f}" width="{bar_w:.1f}" height="5" rx="2"/>'
        "</a>"
    )


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"
