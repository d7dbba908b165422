"""Fixtures of the integration tests (helpers live in ``integration_helpers``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from integration_helpers import Processes


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo datasets, generated once per session; every task finds them through TFPS_DEMO_DIR."""
    from tfps.models import demo
    d = tmp_path_factory.mktemp("demo-data")
    demo.ensure_demo_data(str(d))
    return d


@pytest.fixture(scope="session", autouse=True)
def _demo_env(demo_dir):
    old = os.environ.get("TFPS_DEMO_DIR")
    os.environ["TFPS_DEMO_DIR"] = str(demo_dir)
    yield
    if old is None:
        os.environ.pop("TFPS_DEMO_DIR", None)
    else:
        os.environ["TFPS_DEMO_DIR"] = old


@pytest.fixture
def procs(tmp_path):
    reg = Processes(tmp_path)
    yield reg
    reg.cleanup()


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory):
    reg = Processes(tmp_path_factory.mktemp("logs"))
    yield reg
    reg.cleanup()
