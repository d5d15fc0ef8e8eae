"""Interleaved repeats and the statistics the report quotes (median and spread, never a single run)."""

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass
class Spread:
    """The median of some samples and their range, e.g. epoch seconds or per-repeat ratios."""

    median: float
    low: float
    high: float
    samples: list[float]

    @classmethod
    def of(cls, samples: list[float]) -> "Spread":
        return cls(statistics.median(samples), min(samples), max(samples), list(samples))

    def as_dict(self) -> dict:
        return {"median": self.median, "low": self.low, "high": self.high, "samples": self.samples}


def interleave(candidates: Mapping[str, Callable[[], list[float]]], repeats: int) -> dict[str, list[list[float]]]:
    """Run every candidate once per repeat, in turn, so load changes on the machine fall on all of them alike.

    A candidate returns the seconds of each unit it timed (an epoch, a start-up); the result keeps them per
    repeat, so that `paired_ratio` can compare candidates within the same repeat.
    """
    seconds: dict[str, list[list[float]]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            seconds[name].append(run())
    return seconds


def paired_ratio(numerator: list[list[float]], denominator: list[list[float]]) -> Spread:
    """`numerator / denominator` of each repeat's median times, as a Spread over the repeats."""
    return Spread.of([statistics.median(a) / statistics.median(b) for a, b in zip(numerator, denominator, strict=True)])


def all_units(seconds: list[list[float]]) -> Spread:
    """Every timed unit of every repeat."""
    return Spread.of([value for repeat in seconds for value in repeat])
