"""The tests page: one static HTML file, a row per test, readable offline.

No script and no external resource: the page is published next to the offline dashboard and
opened from a CI artifact, where neither a CDN nor a server can be counted on. Each row shows
the test's verdict, its outcome strip over the window (one square per run, oldest first; the
tooltip names the commit, runner and seeds), failure and flip rates, median duration, and for
its last failure the run's seed with the command that replays it.
"""

from __future__ import annotations

import html
import shlex
import statistics
from collections.abc import Mapping, Sequence

from harness.history.records import Observation, Outcome
from harness.history.scores import Score, Verdict

__all__ = ["COLORS", "render"]

COLORS = {Outcome.PASS: "#2da44e", Outcome.FAIL: "#cf222e", Outcome.SKIP: "#afb8c1"}
"""Square colours of the outcome strip (a test of the page looks for them in a screenshot)."""
_BADGE = {
    Verdict.BROKEN: "#82071e",
    Verdict.SEED_DEPENDENT: "#8250df",
    Verdict.FLAKY: "#bf8700",
    Verdict.HEALTHY: "#1a7f37",
    Verdict.INSUFFICIENT: "#6e7781",
}

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1f2328; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid #d0d7de;
         vertical-align: top; }
th { background: #f6f8fa; }
.badge { color: #fff; border-radius: 10px; padding: 1px 8px; white-space: nowrap; }
.strip { white-space: nowrap; }
.sq { display: inline-block; width: 9px; height: 18px; margin-right: 1px; }
.ev { color: #57606a; font-size: 12px; }
code { font-size: 12px; background: #f6f8fa; padding: 1px 4px; }
.num { text-align: right; white-space: nowrap; }
""" + "".join(f".sq.{k} {{ background: {c}; }}\n" for k, c in COLORS.items())


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _square(o: Observation) -> str:
    if o.verdict is Outcome.PASS:
        # Passes carry no tooltip: a 2,000-test page has 100,000 squares, and the runs worth
        # hovering are the others.
        return '<span class="sq pass"></span>'
    title = (
        f"{o.outcome} · commit {(o.commit or '?')[:12]} · runner {o.runner or '?'} · "
        f"run seed {o.run_seed if o.run_seed is not None else '?'} · test seed "
        f"{o.seed if o.seed is not None else '?'}"
    )
    return f'<span class="sq {o.verdict}" title="{_e(title)}"></span>'


def _repro(nodeid: str, o: Observation | None) -> str:
    if o is None:
        return "-"
    if o.run_seed is None:
        return f"commit {_e((o.commit or '?')[:12])} (no seed recorded)"
    return (
        f"commit {_e((o.commit or '?')[:12])}, seed {o.run_seed}<br>"
        f"<code>pytest {_e(_shell(nodeid))} --harness-seed={o.run_seed}</code>"
    )


def _shell(text: str) -> str:
    return shlex.quote(text)


def render(
    scores: Sequence[Score],
    histories: Mapping[str, Sequence[Observation]],
    *,
    window: int,
    runs: int,
    title: str = "ml-harness: tests",
) -> str:
    """The page, for ``scores`` (in the order given) and each test's observations."""
    counts = {v: sum(s.verdict is v for s in scores) for v in Verdict}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    rows = []
    for s in scores:
        obs = histories.get(s.nodeid, [])
        durations = [o.duration_s for o in obs if o.duration_s is not None]
        median = f"{statistics.median(durations):.2f} s" if durations else "-"
        rows.append(
            "<tr>"
            f'<td><span class="badge" style="background:{_BADGE[s.verdict]}">'
            f"{_e(s.verdict)}</span></td>"
            f'<td><code>{_e(s.nodeid)}</code><div class="ev">{_e("; ".join(s.evidence))}'
            "</div></td>"
            f'<td class="strip">{"".join(_square(o) for o in obs)}</td>'
            f'<td class="num">{s.failures}/{s.runs} ({s.failure_rate:.0%})</td>'
            f'<td class="num">{s.flip_rate:.0%}</td>'
            f'<td class="num">{median}</td>'
            f"<td>{_repro(s.nodeid, s.last_failure)}</td>"
            "</tr>"
        )
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n"
        f"<h1>{_e(title)}</h1>\n"
        f"<p>{len(scores)} test(s) over the last {min(window, runs)} of {runs} run(s): "
        f"{_e(summary)}. Most disruptive first; each square is one run, oldest first "
        "(hover over a failure for its commit, runner and seeds).</p>\n"
        '<table id="tests"><thead><tr><th>verdict</th><th>test</th><th>outcomes</th>'
        "<th>failed</th><th>flips</th><th>median</th><th>last failure</th></tr></thead>"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody></table>\n</body></html>\n"
    )
