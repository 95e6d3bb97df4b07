"""Render `harness tolerances propose --json` files as the markdown tables of
docs/benchmarks/tolerances.md.

    .venv/bin/python docs/tools/tolerances_table.py [--mutants M.json]... main.json train.json

A ``--mutants`` file is a ``propose --mutants --json`` output: its killed counts go in the
mutants column of every site in the test files it ran (the other rows get "-").
"""

from __future__ import annotations

import json
import sys


def _bound(site: dict, rtol: float | None = None, atol: float | None = None) -> str:
    rtol = site["rtol"] if rtol is None else rtol
    atol = site["atol"] if atol is None else atol
    if site["kind"] == "within":
        text = f"bound {atol:.3g}"
    else:
        text = f"rtol={rtol:.3g}, atol={atol:.3g}"
        if site["bound"] not in ("given", ""):
            text += f" ({site['bound']})"
    return text + (" (varies; worst shown)" if site["bounds_vary"] else "")


def _holdout(site: dict) -> str:
    h = site.get("holdout")
    if not h:
        return "-"
    if isinstance(h, list):  # files written before the held-out record had fields
        return f"{h[0]} of {h[1]} over"
    text = f"{h['over']} of {h['runs']} over the {h['bound']} bound (expected {h['expected']:.2g}"
    text += f"; p = {h['p']:.2g})" if h["over"] else ")"
    return text


def _mutants(site: dict, mutants: list[dict]) -> str:
    path = site["site"].rpartition(":")[0]
    for m in mutants:
        if path in m.get("tests", []):
            cur, pro = m["current"], m["proposed"]
            return f"{cur['killed']} / {pro['killed']} of {cur['total']}"
    return "-"


def main(argv: list[str]) -> None:
    mutants, paths = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--mutants":
            with open(next(args)) as fh:
                mutants.append(json.load(fh)["mutants"])
        else:
            paths.append(arg)
    print("| site | kind | runs | current bound | observed max share | proposed (F, 90% interval) "
          "| verdict | held-out | mutants killed, current / proposed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        for s in data["sites"]:
            if s["factor"] is not None:
                proposed = (
                    f"{_bound(s, s['proposed_rtol'], s['proposed_atol'])} "
                    f"(x{s['factor']:.3g}; fit {s['estimate']:.3g} "
                    f"[{s['low']:.3g}, {s['high']:.3g}], shape {s['shape']:.2f}"
                    f"{' raised to 0' if s.get('shape_floored') else ''})"
                )
            else:
                proposed = "-"
            print(
                f"| `{s['site']}` ({s['function']}) | {s['kind']} | {s['runs']} | {_bound(s)} "
                f"| {s['max_used']:.3g} | {proposed} | {s['verdict']} | {_holdout(s)} "
                f"| {_mutants(s, mutants)} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
