"""Lineage: which data, code and artifacts a run consumed and what it produced, both ways.

Nodes are named ``kind:id``: ``run:<run id>``, ``artifact:<sha256>``, ``dataset:<name>@<version>``,
``code:<git commit>`` (any lowercase kind is accepted). Edges point forward in time: what was
consumed points at the run that consumed it (relation ``input``), a run points at what it
produced (``output``). So *forward* from ``dataset:imagenet@3`` answers "which runs used this
dataset, and what did they (and the runs that used their outputs) produce", and *backward*
from ``artifact:<sha>`` answers "what data, code and parent artifacts produced this checkpoint".

Both directions are one recursive CTE (``WITH RECURSIVE``; UNION, not UNION ALL, so cycles
end), the same SQL on SQLite and PostgreSQL. Exports: :meth:`Graph.to_json` and
:meth:`Graph.to_dot` (Graphviz).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from reference_impls.tracking.errors import NotFoundError, TrackingError
from reference_impls.tracking.schema import Artifact, LineageEdge, Run

__all__ = ["Graph", "check_node", "lineage"]

NODE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}:[^\s\"\\]{1,260}")
DIRECTIONS = ("forward", "backward")


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE_RE.fullmatch(node):
        raise TrackingError(
            f"invalid lineage node {node!r}: write KIND:ID, e.g. run:<id>, artifact:<sha256>, "
            "dataset:imagenet@3, code:<commit> (no spaces, quotes or backslashes)"
        )
    return node


@dataclass
class Graph:
    root: str
    direction: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: list[tuple[str, str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "direction": self.direction,
            "nodes": [{"id": k, **v} for k, v in sorted(self.nodes.items())],
            "edges": [{"src": s, "dst": d, "relation": r} for s, d, r in self.edges],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_dot(self) -> str:
        def q(text: str) -> str:
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

        shapes = {"run": "box", "artifact": "note", "dataset": "cylinder", "code": "component"}
        lines = ["digraph lineage {", "  rankdir=LR;"]
        for node, attrs in sorted(self.nodes.items()):
            label = attrs.get("label") or node
            shape = shapes.get(attrs["kind"], "ellipse")
            style = ", style=bold" if node == self.root else ""
            lines.append(f"  {q(node)} [label={q(label)}, shape={shape}{style}];")
        for s, d, r in self.edges:
            lines.append(f"  {q(s)} -> {q(d)} [label={q(r)}];")
        lines.append("}")
        return "\n".join(lines) + "\n"


def lineage(meta: Any, node: str, *, direction: str = "backward") -> Graph:
    """Everything reachable from ``node`` following edges forward or backward."""
    check_node(node)
    if direction not in DIRECTIONS:
        raise TrackingError(f"direction must be forward or backward, got {direction!r}")
    e = LineageEdge.__table__
    near, far = (e.c.src, e.c.dst) if direction == "forward" else (e.c.dst, e.c.src)
    seed = select(far.label("node")).where(near == node)
    reach = seed.cte("reach", recursive=True)
    step = select(far.label("node")).join(reach, near == reach.c.node)
    reach = reach.union(step)
    nodes_q = select(reach.c.node)
    with meta.read_engine.connect() as conn:
        reached = set(conn.scalars(nodes_q))
        known = reached | {node}
        if not reached and not _exists(conn, node):
            raise NotFoundError(f"lineage node {node!r} has no edges and names nothing stored")
        edges = []
        all_nodes = sorted(known)
        for i in range(0, len(all_nodes), 500):
            chunk = all_nodes[i : i + 500]
            rows = conn.execute(select(e.c.src, e.c.dst, e.c.relation).where(near.in_(chunk))).all()
            edges += [tuple(r) for r in rows if (r[1] if direction == "forward" else r[0]) in known]
        graph = Graph(node, direction)
        for n in sorted(known):
            graph.nodes[n] = {"kind": n.split(":", 1)[0], "label": n}
        _label(conn, graph)
    graph.edges = sorted(set(edges))
    return graph


def _exists(conn: Any, node: str) -> bool:
    kind, ident = node.split(":", 1)
    if kind == "run":
        return conn.scalar(select(Run.id).where(Run.id == ident)) is not None
    if kind == "artifact":
        return conn.scalar(select(Artifact.id).where(Artifact.sha256 == ident).limit(1)) is not None
    return False


def _label(conn: Any, graph: Graph) -> None:
    runs = [n.split(":", 1)[1] for n in graph.nodes if n.startswith("run:")]
    shas = [n.split(":", 1)[1] for n in graph.nodes if n.startswith("artifact:")]
    for i in range(0, len(runs), 500):
        for rid, name, status in conn.execute(
            select(Run.id, Run.name, Run.status).where(Run.id.in_(runs[i : i + 500]))
        ):
            graph.nodes[f"run:{rid}"].update(label=f"run {name} ({status})", status=status)
    for i in range(0, len(shas), 500):
        for sha, name, size in conn.execute(
            select(Artifact.sha256, Artifact.name, Artifact.size).where(
                Artifact.sha256.in_(shas[i : i + 500])
            )
        ):
            graph.nodes[f"artifact:{sha}"].update(label=f"{name} ({sha[:12]}, {size} B)", size=size)
