"""Reading a Prometheus text exposition (the gateway's and vLLM's /metrics) in tests."""

from __future__ import annotations

import re

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (all of them when none are
    given); fails the test when there is no such sample."""
    sample = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", re.MULTILINE)
    values = [
        float(value)
        for found, value in sample.findall(text)
        if labels.items() <= dict(LABEL.findall(found)).items()
    ]
    assert values, f"{name} {labels or ''} not in the metrics"
    return sum(values)
