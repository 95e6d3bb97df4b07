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
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from reference_impls.tracking.errors import NotFoundError, TrackingError
from reference_impls.tracking.schema import Artifact, LineageEdge, Project, Run

__all__ = ["Graph", "check_node", "check_relation", "lineage"]

# No NUL or lone surrogate either: neither is storable text on both databases.
NODE_RE = re.compile('[a-z][a-z0-9_]{0,31}:[^\\s"\\\\\x00\ud800-\udfff]{1,260}')
RELATION_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
DIRECTIONS = ("forward", "backward")


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE_RE.fullmatch(node):
        shown = ascii(node) if isinstance(node, str) else repr(node)
        raise TrackingError(
            f"invalid lineage node {shown}: write KIND:ID, e.g. run:<id>, artifact:<sha256>, "
            "dataset:imagenet@3, code:<commit> (no spaces, quotes, backslashes or NUL)"
        )
    return node


def check_relation(relation: object) -> str:
    if not isinstance(relation, str) or not RELATION_RE.fullmatch(relation):
        raise TrackingError(
            f"invalid lineage relation {relation!r}: 1-32 lowercase letters, digits, '_' "
            "starting with a letter (input, output, ...)"
        )
    return relation


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


def lineage(
    meta: Any,
    node: str,
    *,
    direction: str = "backward",
    projects: Collection[str] | None = None,
) -> Graph:
    """Everything reachable from ``node`` following edges forward or backward.

    ``projects`` (None: all) scopes the answer to what a caller of those projects may see.
    Content addressing shares one ``artifact:<sha256>`` node between every project that stored
    the same bytes, so the raw graph joins projects; the scoped graph keeps only what is
    reachable from ``node`` without passing through a run of another project, and labels an
    artifact with a name its own projects gave it (never another project's name or size)."""
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
        if projects is not None:
            known, edges = _scoped(conn, node, direction, known, edges, set(projects))
            if not known:
                # The same answer as for a node that names nothing: a scoped caller learns
                # nothing about what other projects hold.
                raise NotFoundError(f"lineage node {node!r} has no edges and names nothing stored")
        for n in sorted(known):
            graph.nodes[n] = {"kind": n.split(":", 1)[0], "label": n}
        _label(conn, graph, None if projects is None else set(projects))
    graph.edges = sorted(set(edges))
    return graph


def _run_projects(conn: Any, run_ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(0, len(run_ids), 500):
        out.update(
            conn.execute(
                select(Run.id, Project.name)
                .join(Project, Project.id == Run.project_id)
                .where(Run.id.in_(run_ids[i : i + 500]))
            ).all()
        )
    return out


def _held_by(conn: Any, shas: list[str], projects: set[str]) -> set[str]:
    """The hashes among ``shas`` that an artifact row of one of ``projects`` names."""
    held: set[str] = set()
    for i in range(0, len(shas), 500):
        held.update(
            conn.scalars(
                select(Artifact.sha256)
                .join(Run, Run.id == Artifact.run_id)
                .join(Project, Project.id == Run.project_id)
                .where(Artifact.sha256.in_(shas[i : i + 500]), Project.name.in_(projects))
            )
        )
    return held


def _scoped(
    conn: Any,
    root: str,
    direction: str,
    known: set[str],
    edges: list[tuple[str, str, str]],
    projects: set[str],
) -> tuple[set[str], list[tuple[str, str, str]]]:
    """(nodes, edges) reachable from ``root`` through no run outside ``projects``; empty when
    the root itself is hidden, or when it is a bare hash or name no visible project holds."""
    runs = [n[4:] for n in known if n.startswith("run:")]
    owner = _run_projects(conn, runs)
    hidden = {f"run:{r}" for r in runs if owner.get(r) not in projects}
    if root in hidden:
        return set(), []
    nxt: dict[str, list[str]] = {}
    for s, d, _r in edges:
        a, b = (s, d) if direction == "forward" else (d, s)
        nxt.setdefault(a, []).append(b)
    reach, todo = {root}, [root]
    while todo:
        for b in nxt.get(todo.pop(), ()):
            if b not in reach and b not in hidden:
                reach.add(b)
                todo.append(b)
    kept = [e for e in edges if e[0] in reach and e[1] in reach]
    # A root with no visible edge is shown only if it is a visible run or a visible project
    # stores its bytes.
    if (
        not kept
        and not root.startswith("run:")
        and not (root.startswith("artifact:") and _held_by(conn, [root[9:]], projects))
    ):
        return set(), []
    return reach, kept


def _exists(conn: Any, node: str) -> bool:
    kind, ident = node.split(":", 1)
    if kind == "run":
        return conn.scalar(select(Run.id).where(Run.id == ident)) is not None
    if kind == "artifact":
        return conn.scalar(select(Artifact.id).where(Artifact.sha256 == ident).limit(1)) is not None
    return False


def _label(conn: Any, graph: Graph, projects: set[str] | None) -> None:
    """Run and artifact labels; with ``projects``, an artifact's from those projects' rows only
    (another project's name for the same bytes is its metadata, not shared)."""
    runs = [n.split(":", 1)[1] for n in graph.nodes if n.startswith("run:")]
    shas = [n.split(":", 1)[1] for n in graph.nodes if n.startswith("artifact:")]
    for i in range(0, len(runs), 500):
        for rid, name, status in conn.execute(
            select(Run.id, Run.name, Run.status).where(Run.id.in_(runs[i : i + 500]))
        ):
            graph.nodes[f"run:{rid}"].update(label=f"run {name} ({status})", status=status)
    for i in range(0, len(shas), 500):
        stmt = select(Artifact.sha256, Artifact.name, Artifact.size).where(
            Artifact.sha256.in_(shas[i : i + 500])
        )
        if projects is not None:
            stmt = (
                stmt.join(Run, Run.id == Artifact.run_id)
                .join(Project, Project.id == Run.project_id)
                .where(Project.name.in_(projects))
            )
        # Ordered, so that a hash several rows name gets the same label on every call.
        for sha, name, size in conn.execute(stmt.order_by(Artifact.sha256, Artifact.name.desc())):
            graph.nodes[f"artifact:{sha}"].update(label=f"{name} ({sha[:12]}, {size} B)", size=size)
