"""Fixtures of the transformers tests; the helpers themselves live in ``tests/helpers``."""

from __future__ import annotations

import pytest

from tests.helpers.models import LastHidden
from tests.helpers.ort import max_abs_diff, run_ort


@pytest.fixture
def last_hidden() -> type[LastHidden]:
    return LastHidden


@pytest.fixture
def ort_run():
    return run_ort


@pytest.fixture
def diff():
    return max_abs_diff
