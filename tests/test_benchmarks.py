"""The benchmark suite's pure parts: summaries, ratios, targets, the crop rule. (The suite
itself runs in CI as `python -m benchmarks.run --quick`.)"""


import re

import pytest

from benchmarks import report


def _run(seconds, batches=10, batch_bytes=1_000_000, **extra):
    epochs = [{"seconds": s, "batches": batches, "consumer_thread_cpu": 0.01, "main_cpu": 0.02,
               "workers_cpu": 0.05, "duplicates": 0, "missing": 0, "checksum": 5.0} for s in seconds]
    return {"epochs": epochs, "batches_per_epoch": batches, "batch_bytes": batch_bytes, "batch_size": 4,
            "time_to_first_batch": 0.1, "expected_checksum": 5.0, "peak_pss": 300e6, "baseline_pss": 100e6,
            **extra}


@pytest.mark.pure
def test_a_run_is_summarized_from_its_median_epoch_and_per_batch_totals():
    s = report.summarize_run(_run([1.0, 0.5, 2.0]))
    assert s["batches_per_s"] == 10 and s["mb_per_s"] == 10 and s["images_per_s"] == 40
    assert s["main_cpu_ms"] == pytest.approx(2.0) and s["workers_cpu_ms"] == pytest.approx(5.0)
    assert s["peak_pss_above_start_mb"] == 200 and s["checksum_ok"]


@pytest.mark.pure
def test_a_wrong_checksum_is_reported_unless_the_epoch_had_duplicates():
    run = _run([1.0])
    run["epochs"][0]["checksum"] = 6.0
    assert not report.summarize_run(run)["checksum_ok"]
    run["epochs"][0]["duplicates"] = 3  # an unordered peer's epoch: its checksum cannot match
    assert report.summarize_run(run)["checksum_ok"]


@pytest.mark.pure
def test_runs_combine_to_medians_with_their_range_and_skips_are_kept():
    combined = report.combine([_run([1.0]), _run([0.5]), _run([0.25]), {"error": "timed out"}])
    assert combined["batches_per_s"] == 20 and combined["batches_per_s_range"] == (10, 40) and combined["runs"] == 3
    assert report.combine([{"skipped": "cannot import spdl"}]) == {"skipped": "cannot import spdl"}


@pytest.mark.pure
def test_targets_compare_shmload_with_the_named_peers():
    results = {"tiny": {"shmload": report.combine([_run([0.1])]), "torch": report.combine([_run([1.0])]),
                        "tp-runner": report.combine([_run([0.05])]), "zmq-pool": report.combine([_run([0.25])])}}
    by_text = {t.text: t for t in report.targets(results, None, 2)}
    assert by_text["tiny: shmload / torch DataLoader"].value == pytest.approx(10)
    assert by_text["tiny: shmload / torch DataLoader"].met is False
    assert by_text["tiny: shmload / tensorpack MultiProcessRunnerZMQ"].value == pytest.approx(0.5)
    assert by_text["tiny: shmload / ZMQ pickle-5 pool (zmq-pool)"].value == pytest.approx(2.5)
    assert by_text["tiny: shmload / ZMQ pickle-5 pool (zmq-pool)"].met is True
    assert by_text["transport-big: shmload / torch DataLoader"].met is None  # not run
    assert "[MISSED]" in by_text["tiny: shmload / torch DataLoader"].line()


@pytest.mark.pure
def test_a_peer_target_also_reports_the_rounds_own_ratios_paired_by_round():
    # three rounds on a host that slows down: each round's ratio is 2, the ratio of the
    # medians is not; a round where either loader failed is left out of the pairs
    shm_runs = [_run([0.1]), _run([0.2]), _run([0.4]), _run([0.1])]
    runner_runs = [_run([0.2]), _run([0.4]), _run([0.8]), {"error": "timed out"}]
    runs = {"tiny": {"shmload": shm_runs, "tp-runner": runner_runs}}
    assert report.rounds_ratios(shm_runs, runner_runs) == pytest.approx([2.0, 2.0, 2.0])
    results = {w: {name: report.combine(r) for name, r in by.items()} for w, by in runs.items()}
    by_text = {t.text: t for t in report.targets(results, None, 2, runs)}
    target = by_text["tiny: shmload / tensorpack MultiProcessRunnerZMQ"]
    assert target.value == pytest.approx(results["tiny"]["shmload"]["batches_per_s"] / 25)  # judged on the medians
    assert target.rounds == pytest.approx((2.0, 2.0, 2.0, 3))
    assert re.search(r"the rounds' own ratios: median 2\.00, 2\.00-2\.00 over 3$", target.line())
    # one round, or no runs given: the line is the ratio of the medians alone
    one = {"tiny": {"shmload": shm_runs[:1], "tp-runner": runner_runs[:1]}}
    assert "rounds" not in {t.text: t for t in report.targets(results, None, 2, one)}[target.text].line()
    assert {t.text: t for t in report.targets(results, None, 2)}[target.text].rounds is None


@pytest.mark.pure
def test_the_table_names_every_loader_and_flags_unordered_and_duplicate_output():
    shm = report.combine([_run([0.1])])
    runner = report.combine([_run([0.2])])
    runner.update(ordered=False, duplicates=8, missing=8)
    text = report.table("transport", {"shmload": shm, "tp-runner": runner, "spdl": {"skipped": "no spdl"}}, None, 2)
    assert "**shmload**" in text and "0.50x" in text and "skipped: no spdl" in text
    assert "8 dup / 8 missing samples, unordered" in text


@pytest.mark.pure
def test_the_soak_slope_ignores_the_warm_up_half_and_is_per_hour():
    from benchmarks.soak import slope

    times = [60.0 * k for k in range(10)]  # one sample a minute
    values = [500.0] * 5 + [100.0 + 2.0 * k for k in range(5, 10)]  # warm-up, then 2 MiB a minute
    assert slope(times, values) == pytest.approx(120.0)
    assert slope(times, [7.0] * 10) == pytest.approx(0.0, abs=1e-9)
    assert slope([0.0], [1.0]) == 0.0


def test_the_pinned_benchmark_says_why_it_measures_nothing_without_cuda():
    import subprocess
    import sys
    from pathlib import Path
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None and " \
            "__import__('torch').cuda.is_available())"
    if subprocess.run([sys.executable, "-c", probe], timeout=120).returncode:
        pytest.skip("CUDA is available here: the benchmark measures instead")
    done = subprocess.run([sys.executable, "-m", "benchmarks.pinned", "--quick"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert re.match(r"benchmarks\.pinned: skipped, nothing measured: (torch is not installed|CUDA is not available)",
                    done.stdout)


@pytest.mark.pure
def test_an_epochs_checks_run_after_its_clocks_stop(monkeypatch):
    """The checks (np.unique over every label: ~45 ms for a tiny epoch) are the benchmark's
    own work, not the loader's: inside the clocks they were a third of a tiny epoch."""
    import time

    import numpy as np

    from benchmarks import measure, peers

    events = []
    summary = measure.Tally.summary
    monkeypatch.setattr(measure.Tally, "summary", lambda self, *a: events.append("checks") or summary(self, *a))

    class Clocks:  # measure's `time`, noting each reading
        def __getattr__(self, name):
            def read():
                events.append("clock")
                return getattr(time, name)()
            return read

    monkeypatch.setattr(measure, "time", Clocks())
    batches = [(np.zeros((2, 3), np.float32), np.array([0, 1])), (np.ones((2, 3), np.float32), np.array([2, 3]))]
    harness = peers.Harness(lambda: iter(batches), lambda: None, "two fixed batches")
    out = measure.timed_epoch(harness, None, (4, True))
    assert out["batches"] == 2 and out["duplicates"] == 0 and out["missing"] == 0 and out["seconds"] >= 0
    last_clock = max(i for i, e in enumerate(events) if e == "clock")
    assert events.index("checks") > last_clock, events


def test_the_competing_process_of_a_contended_run_stops_with_its_block_also_on_an_error():
    from benchmarks.contend import contender

    with contender(0) as quiet:
        assert quiet.proc is None  # a quiet run: nothing started
    with pytest.raises(RuntimeError), contender(0.5) as busy:
        proc = busy.proc
        assert proc is not None and proc.poll() is None
        raise RuntimeError("a failed measurement")
    assert proc.poll() is not None and busy.proc is None
    assert busy.cores is not None and 0 <= busy.cores <= 1.1


@pytest.mark.pure
def test_autotune_compares_auto_with_the_best_fixed_count_of_each_round():
    from benchmarks.autotune import summarize

    def runs(rates, count, cpu=1.0):
        return [{"rate": r, "batches": 10, "cpu": cpu, "count": count, "changes": [[0.0, count]]} for r in rates]

    rounds = [{"configs": {"1": runs([10, 10, 10], 1), "2": runs([20, 18, 22], 2, cpu=2.0),
                           "auto": runs([16, 20, 19], 2, cpu=1.5)}},
              {"configs": {"1": runs([10, 10, 10], 1), "2": runs([10, 10, 10], 2, cpu=2.0),
                           "auto": runs([9, 10, 10], 1)}}]
    s = summarize(rounds, "2")
    assert s["best_fixed"] == "2" and s["best_fixed_each_round"] == ["2", "1"]  # round 2: a tie, the first wins
    assert s["first_ratios"] == pytest.approx([0.8, 0.9]) and s["later_ratios"] == pytest.approx([0.975, 1.0])
    assert s["first_ratio"] == pytest.approx(0.85) and s["later_ratio"] == pytest.approx(0.9875)
    assert s["later_ratio_of_medians"] == pytest.approx(14.75 / 15)  # medians over rounds: auto's, fixed 2's
    assert s["settled"] == [2, 1] and s["auto_counts"] == [[2, 2, 2], [1, 1, 1]]
    assert s["cpu_ms_later"] == {"auto": pytest.approx(125), "2": pytest.approx(200)}
    assert s["cpu_saving_later"] == pytest.approx(0.375)  # rounds: 1 - 1.5/2, 1 - 1/2
