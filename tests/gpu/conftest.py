"""The GPU tier runs only where asked (``make test-gpu``) and needs a CUDA device: without one it
stops with a one-line message instead of passing vacuously."""

import pytest
import torch


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected what was not asked for
def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items) and not torch.cuda.is_available():
        raise pytest.UsageError("the gpu tier needs a CUDA device; this machine has none (run `make test` instead)")
