"""Every engine test runs twice: with the default window (nothing is paged out at these
depths) and with a window of 1, so nearly every available message is paged out and back in
(broker.engine.paging): the queue rules must not notice."""

import pytest

from broker.engine import queue


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.module.__name__
    if "test_engine" in name or "test_queries" in name:
        metafunc.fixturenames.append("paging")
        metafunc.parametrize("paging", ["window", "paged"], indirect=True)


@pytest.fixture
def paging(request, monkeypatch):
    if request.param == "paged":
        monkeypatch.setattr(queue, "WINDOW", 1)
    return request.param
