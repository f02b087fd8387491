"""Words for metrics."""

from __future__ import annotations

import math

from fedhet.report.labels import format_value, metric_info


def test_known_prefixed_and_unknown_metrics() -> None:
    acc = metric_info("test_accuracy")
    assert (acc.low, acc.high, acc.count) == (0.0, 1.0, False) and "mean over clients" in acc.label
    unseen = metric_info("unseen_gm_appeal")
    assert unseen.label.endswith("unseen clients") and unseen.high == 1.0
    assert "fine-tuning" in metric_info("ft_unseen_gm_appeal").title
    assert metric_info("available").count and metric_info("rounds_to_target").count
    other = metric_info("mgda_lambda_max")
    assert other.label == "mgda lambda max" and other.low is None


def test_format_value() -> None:
    assert format_value("participants", 10.0) == "10"
    assert format_value("available", 9.5) == "9.5000"  # a mean of counts keeps its decimals
    assert format_value("test_accuracy", 1.0) == "1.0000"
    assert format_value("test_accuracy", math.nan) == "n/a"


def test_bytes_are_whole_numbers_with_thousands_separators() -> None:
    assert format_value("bytes_up", 1234560.0) == "1,234,560"
    assert format_value("bytes_down", 2469120.5) == "2,469,120"  # a mean over seeds: no decimals either
    assert format_value("bytes_up", 0.0) == "0" and format_value("bytes_up", math.nan) == "n/a"
