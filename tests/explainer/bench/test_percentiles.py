"""The nearest-rank percentile against its definition, counted by hand."""

from __future__ import annotations

import pytest

from explainer.bench.percentiles import percentile


@pytest.mark.parametrize("n", [1, 2, 5, 19, 20, 21, 100])
@pytest.mark.parametrize("q", [50, 95, 100])
def test_the_smallest_value_with_q_percent_at_or_below_it(n, q):
    values = [float(v) for v in reversed(range(n))]
    got = percentile(values, q)
    assert sum(v <= got for v in values) >= q / 100 * n  # at least q% at or below it
    assert all(sum(v <= smaller for v in values) < q / 100 * n for smaller in values if smaller < got)  # smallest


def test_no_values():
    assert percentile([], 95) is None
