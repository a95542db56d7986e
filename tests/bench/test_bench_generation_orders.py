"""bench/bench_generation_orders.py: every process loads the folders in its own order, and a
folder's figure is the median of its per-process ratios, with their range."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script


def test_the_processes_load_the_folders_in_several_orders() -> None:
    bench = load_script("bench/bench_generation_orders.py")
    labels = ["builder", "before", "now"]
    orders = bench.orders(labels, 6)
    assert all(sorted(order) == sorted(labels) for order in orders)
    assert len({tuple(order) for order in orders}) >= 3  # not one order six times
    # each folder loads first in two of the six (the first-loaded one is the one moved most)
    assert sorted(order[0] for order in orders) == sorted(labels * 2)
    assert bench.orders(labels, 6) == orders  # seeded: a rerun loads alike


def test_each_figure_is_the_median_of_the_per_process_ratios() -> None:
    bench = load_script("bench/bench_generation_orders.py")
    per_process = [
        bench.ratios({"builder": 100.0, "ours": 98.0}, "builder"),
        bench.ratios({"builder": 50.0, "ours": 51.0}, "builder"),
        bench.ratios({"builder": 10.0, "ours": 9.0}, "builder"),
    ]
    assert per_process[0] == {"ours": pytest.approx(0.98)}
    median, low, high = bench.summary(per_process)["ours"]
    assert (median, low, high) == pytest.approx((0.98, 0.9, 1.02))


def test_alone_every_round_runs_each_folder_in_a_process_of_its_own() -> None:
    bench = load_script("bench/bench_generation_orders.py")
    assert bench.alone_rounds(["builder", "ours"], 6) == [["builder", "ours"]] * 3
    with pytest.raises(ValueError, match="not a multiple of 2"):
        bench.alone_rounds(["builder", "ours"], 5)
