"""Fixtures for the compiled-path tests (helpers are in ``tests/compiler/compare.py``).

The on-disk kernel cache defaults to the user's home; every test here points it at a
temporary folder instead (``FUSEGRAD_CACHE_DIR`` plus ``fusegrad.config.reload()``).
"""

from __future__ import annotations

import pytest

from fusegrad import config as fg_config


@pytest.fixture(autouse=True)
def _kernel_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Keep the disk cache of every compiled test out of the user's home."""
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.delenv("FUSEGRAD_DEBUG", raising=False)
    fg_config.reload()
    yield
    monkeypatch.undo()
    fg_config.reload()



def pytest_configure(config):
    # As tests/conftest.py does for fusegrad.ops.prims: compiled programs are as silent about
    # NaN and Inf as eager ops, and pytest's capture would drop the module's own filter.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:fusegrad.runtime.cpu")
