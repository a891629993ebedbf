"""Fixture of the serving tests: a scenario file with a `serving:` section (helpers in serving_helpers.py)."""

import pytest

from serving_helpers import write_scenario


@pytest.fixture
def scenario(tmp_path):
    def make(serving=None, **kw):
        return write_scenario(tmp_path, serving, **kw)
    return make
