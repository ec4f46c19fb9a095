"""One metric family as data: its name, type, help and labels, declared once and used both to
describe a collector (what it may yield, without reading anything) and to build its samples."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

#: One sample: its label values (in the family's label order) and its value.
Sample = tuple[Sequence[str], float]
#: One histogram: its label values, ``(upper bound, cumulative count)`` per bucket ending with
#: +Inf, and the sum of what was observed.
HistogramSample = tuple[Sequence[str], Sequence[tuple[float, int]], float]


@dataclass(frozen=True)
class Family:
    """A metric family an objq collector exposes.

    >>> jobs = Family("objq_example_jobs", "gauge", "Jobs.", labels=("queue",))
    >>> [(s.labels, s.value) for s in jobs.build([(["emails"], 3)]).samples]
    [({'queue': 'emails'}, 3)]
    """

    #: The exposed name; a counter's ends in ``_total``, as its samples are named.
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    #: The base unit the name ends with (``seconds``, ``bytes``), for the OpenMetrics format.
    unit: str = ""

    def __post_init__(self) -> None:
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(
                f"metric {self.name!r}: expected a name ending in _total for a counter and "
                f"only then, found a {self.kind}"
            )

    def build(self, samples: Iterable[Sample] = ()) -> Metric:
        """The family with these samples (none: its description)."""
        if self.kind == "histogram":
            if any(True for _ in samples):
                raise ValueError(f"metric {self.name!r}: a histogram is built by .histogram()")
            return self.histogram()
        family: CounterMetricFamily | GaugeMetricFamily
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)
        else:
            family = GaugeMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)
        for labels, value in samples:
            family.add_metric(list(labels), value)
        return family

    def histogram(self, samples: Iterable[HistogramSample] = ()) -> Metric:
        """The histogram family with these samples (none: its description)."""
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)
        for labels, buckets, total in samples:
            edges = [("+Inf" if bound == math.inf else repr(bound), n) for bound, n in buckets]
            family.add_metric(list(labels), edges, total)
        return family

    def one(self, value: float) -> Metric:
        """The family with one unlabelled sample."""
        return self.build([((), value)])
