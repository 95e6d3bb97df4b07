"""Render `harness tolerances propose --json` files as the markdown table of
docs/benchmarks/tolerances.md.

    .venv/bin/python docs/tools/tolerances_table.py main.json train.json sdpa.json
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


def main(paths: list[str]) -> None:
    print("| site | kind | runs | current bound | observed max share | proposed (F, 90% interval) "
          "| verdict | held-out |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        for s in data["sites"]:
            if s["factor"] is not None:
                proposed = (
                    f"{_bound(s, s['proposed_rtol'], s['proposed_atol'])} "
                    f"(x{s['factor']:.3g}; fit {s['estimate']:.3g} "
                    f"[{s['low']:.3g}, {s['high']:.3g}], shape {s['shape']:.2f})"
                )
            else:
                proposed = "-"
            holdout = s.get("holdout")
            held = f"{holdout[0]} of {holdout[1]} over" if holdout else "-"
            print(
                f"| `{s['site']}` ({s['function']}) | {s['kind']} | {s['runs']} | {_bound(s)} "
                f"| {s['max_used']:.3g} | {proposed} | {s['verdict']} | {held} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
