"""The pytest side of ``harness impact record`` (``-p harness.impact.recorder``).

coverage.py is already measuring this process (started by its ``COVERAGE_PROCESS_START``
start-up hook, :func:`harness.impact.environment`); this plugin labels what it measures:
each test's setup and call with the test's node id (coverage's dynamic context, and
:data:`harness.impact.CONTEXT_ENV` for the processes the test starts), and everything else
with the empty label, *ambient*: collection, the setup of session- and package-wide fixtures
(shared by tests of several files, built by whichever came first) and every teardown (where
those fixtures end). A change to a function that ran ambiently falls back to the import
graph, so attributing shared work to one test can never drop the others.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

from harness.impact import CONTEXT_ENV

_SHARED_SCOPES = ("session", "package")


def _stop_forkserver() -> None:
    """Stop multiprocessing's forkserver, if this process started one. It forks every later
    process from its own state, environment included, so the processes a later test started
    through it would carry the label of the test that started the server (torch.distributed
    launchers use one). Stopped at each label change, the next test that needs it starts a
    fresh one, under its own label. ``_stop`` is the method CPython's own tests use."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


class _Labels:
    def __init__(self, coverage: Any) -> None:
        self._coverage = coverage
        self.current = ""

    def switch(self, label: str) -> None:
        if label != self.current:
            _stop_forkserver()
        self.current = label
        os.environ[CONTEXT_ENV] = label
        self._coverage.switch_context(label)


_labels: _Labels | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _labels
    from coverage import Coverage

    current = Coverage.current()
    if current is None:
        raise pytest.UsageError(
            "harness.impact.recorder: coverage is not measuring this process; record with "
            "`harness impact record`, which starts it in every process the tests run"
        )
    _labels = _Labels(current)
    _labels.switch("")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _labels
    if _labels is not None:
        _labels.switch("")
        _labels = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    if _labels is not None:
        _labels.switch(item.nodeid)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if _labels is not None:
        _labels.switch(item.nodeid)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    if _labels is not None:
        _labels.switch("")
    try:
        return (yield)
    finally:
        if _labels is not None:
            _labels.switch("")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
    if _labels is None or fixturedef.scope not in _SHARED_SCOPES:
        return (yield)
    label = _labels.current
    _labels.switch("")
    try:
        return (yield)
    finally:
        _labels.switch(label)
