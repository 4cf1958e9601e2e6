"""The soak's short test runs the harness (its own Ray cluster) for a few minutes.

The integration session runs this folder in a pytest process of its own
(``--ignore=integration-tests/soak`` in the main one): the harness starts its own
cluster, which must not meet the session-wide one of ``../conftest.py``.
"""

from __future__ import annotations

import pytest

#: The short soak: 2 minutes of faults, then the last round finishes and the checks run.
SOAK_TIMEOUT_S = 900.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Before ../conftest.py gives every test its default limit (pytest-timeout, when installed).
    if config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SOAK_TIMEOUT_S))
