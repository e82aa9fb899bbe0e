"""Shared settings for the property tests: how many examples, which seed, where failures are kept.

Each property test counts the examples it ran and records the count (`record_examples`); the
terminal summary of `make test` prints them (tests/conftest.py), so a run that quietly tested
fewer cases shows it.

- In CI (CI=true) the run is derandomized: the same examples every run, so a red CI is reproducible.
- Elsewhere the seed is random, and a failing example is kept in `.hypothesis/` and replayed first
  on the next run; the explicit `@example`s of each test are the failures found so far, kept for good.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def property_settings(examples: int) -> settings:
    """`examples` examples, no deadline (the box is loaded), fixed seed in CI."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=IN_CI,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def record_examples(request: pytest.FixtureRequest, count: int, minimum: int) -> None:
    """Record how many examples a property test ran (printed by `make test`); fail below `minimum`."""
    request.node.user_properties.append(("hypothesis_examples", count))
    assert count >= minimum, f"only {count} examples ran, want at least {minimum}"
