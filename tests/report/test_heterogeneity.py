"""The heterogeneity measures of `fedhet describe`, pinned by hand on tiny partitions, and its CSV and figure."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from fedhet.report.heterogeneity import Heterogeneity, heterogeneity_figure, js_distance, total_variation


def _report(counts: list[list[int]], **extra: object) -> Heterogeneity:
    table = np.array(counts)
    k = len(table)
    return Heterogeneity(table.sum(axis=1), np.ones(k, dtype=int), np.ones(k, dtype=bool), table, **extra)  # type: ignore[arg-type]


def test_the_distances_of_a_two_client_partition_by_hand() -> None:
    # counts (3, 1) and (1, 3): global (1/2, 1/2); p_1 = (3/4, 1/4), TV = ½(1/4 + 1/4) = 1/4 for both clients.
    # JS: m = (5/8, 3/8); KL(p_1‖m) = ¾ log2(6/5) + ¼ log2(2/3) = 0.051035, KL(g‖m) = ½ log2(4/5) + ½ log2(4/3)
    # = 0.046555; JSD = ½(0.051035 + 0.046555) = 0.048795, distance √ = 0.220896.
    report = _report([[3, 1], [1, 3]])
    assert report.tv is not None and report.js is not None
    assert report.tv.tolist() == pytest.approx([0.25, 0.25])
    assert report.js.tolist() == pytest.approx([0.220896, 0.220896], abs=1e-6)


def test_the_distances_are_zero_for_iid_and_one_for_disjoint_classes() -> None:
    assert total_variation(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert js_distance(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    iid = _report([[2, 4, 6], [1, 2, 3]])
    assert iid.tv is not None and iid.js is not None
    assert np.allclose(iid.tv, 0.0) and np.allclose(iid.js, 0.0, atol=1e-7)
    one_class = _report([[5, 0], [0, 15]])  # global (1/4, 3/4): TV of client 0 = ½(3/4 + 3/4) = 3/4
    assert one_class.tv is not None and one_class.tv.tolist() == pytest.approx([0.75, 0.25])


def test_the_summary_csv_and_figure() -> None:
    report = _report([[3, 1], [1, 3]], groups=np.array([0, 1]), levels=np.array([0.0, 0.5]))
    lines = dict(report.summary())
    assert lines["mean TV distance to global labels"].startswith("0.2500")
    assert lines["group 1"] == "1 clients, level 0.5"
    rows = report.csv_text().splitlines()
    assert rows[0] == "client,group,shift_level,seen,train_samples,test_samples,tv_distance,js_distance,label_0,label_1"
    assert rows[2] == "1,1,0.5,1,4,1,0.250000,0.220896,1,3"
    image = Image.open(io.BytesIO(heterogeneity_figure(report, "a title")))
    assert image.format == "PNG" and image.width > 600
    report.examples = [("group 0", np.zeros((1, 4, 4))), ("group 1", np.ones((3, 4, 4)))]  # grey and colour images
    taller = Image.open(io.BytesIO(heterogeneity_figure(report, "a title")))
    assert taller.height > image.height
    no_classes = Heterogeneity(np.array([3, 5]), np.array([1, 1]), np.array([True, False]), None)
    assert "tv_distance" not in no_classes.csv_text() and math.isclose(float(no_classes.train_sizes.mean()), 4.0)
    assert Image.open(io.BytesIO(heterogeneity_figure(no_classes, "sizes only"))).format == "PNG"
