"""Dashboard fixtures (tests/web is a package so that this conftest does not shadow tests/conftest.py,
which other tests import as ``conftest``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgjobs.web.config import WebConfig
from tests.web.support import TOKEN, RunningWeb, free_port, start_web, stop_web


@pytest.fixture
def make_web(dsn: str) -> Iterator[Callable[..., RunningWeb]]:
    started: list[RunningWeb] = []

    def make(**overrides: Any) -> RunningWeb:
        settings: dict[str, Any] = {"dsn": dsn, "port": free_port(), "token": TOKEN, "poll_interval": 0.2}
        settings.update(overrides)
        web = start_web(WebConfig(**settings))
        started.append(web)
        return web

    yield make
    for web in started:
        stop_web(web)


@pytest.fixture
def web(make_web: Callable[..., RunningWeb]) -> RunningWeb:
    return make_web()
