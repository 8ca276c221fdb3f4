"""Shared fixtures. Tests marked ``gpu`` are skipped cleanly where no CUDA GPU + libcudnn is usable."""
from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def _gpu_reason() -> str | None:
    try:
        from ucudnn.binding import cudnn
        from ucudnn.binding.gpu import cupy

        cupy()
        cudnn.load()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "no GPU here"
        return str(e)


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU with CuPy and libcudnn: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Never touch the user's real cache from tests."""
    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "cache.sqlite"))


class RecordingSource:
    """An inner source for the wrapping sources (relayout, fold) that records what it is asked to prepare."""

    name = "inner-fake"

    def __init__(self):
        self.prepared = []

    def prepare(self, op, problem, config):
        self.prepared.append((op, problem, config))
        return lambda *call: None


@pytest.fixture
def inner(monkeypatch):
    """A :class:`RecordingSource`, registered so that configurations naming it find it."""
    from ucudnn.measure.sources import registry

    fake = RecordingSource()
    monkeypatch.setitem(registry._SOURCES, fake.name, fake)
    return fake
