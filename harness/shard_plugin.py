"""A small pytest plugin that records the whole collection of a sharded run.

``harness run --shard K/N`` loads it with ``-p harness.shard_plugin``; it is not an entry-point
plugin because only sharded runs need it. It writes the node ids every shard sees *before*
pytest-split keeps this shard's part, after every other filter (tiers, ``-k``, ``-m``), so the
merge can check that the shards' tests add up to exactly this list (:mod:`harness.shards`).

Hook order is what makes that true: pytest-split selects in a ``trylast``
``pytest_collection_modifyitems`` of an object it registers in its ``pytest_configure``. The
hook here is also ``trylast``, and this module is registered earlier (``-p`` plugins load
before entry-point plugins, long before any ``pytest_configure``); pluggy calls the
earlier-registered of two ``trylast`` implementations first. So every other filter has run,
and pytest-split has not. The shard tests check this order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "ml-harness: tiers, seeds, goldens, quarantine")
    group.addoption(
        "--harness-shard-collection",
        dest="harness_shard_collection",
        default=None,
        metavar="PATH",
        help="write the node ids collected before pytest-split's selection to PATH "
        "(harness run --shard sets it). Default: none.",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = config.getoption("harness_shard_collection")
    splits = getattr(config.option, "splits", None)  # pytest-split's --splits
    if path and splits and 0 < len(items) < splits:
        # Some shard would get no test and exit 5 ("nothing ran"), a red job whose reason is
        # nowhere on it; with fewer tests than shards the split is a mistake, said by name.
        # (An empty collection is left to exit 5 in every shard: nothing was selected at all.)
        raise pytest.UsageError(
            f"--shard K/{splits}: {splits} shards but only {len(items)} test(s) collected, so "
            f"at least {splits - len(items)} shard(s) would run nothing; split into at most "
            f"{len(items)} shards"
        )
    # Under xdist the workers collect; each would write the same list, so only one does.
    if not path or getattr(config, "workerinput", {}).get("workerid", "gw0") != "gw0":
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"collected": [item.nodeid for item in items]}) + "\n")
    os.replace(tmp, target)
