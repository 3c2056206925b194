"""Pure reporting: per-run summaries, the table of ratios, the targets, the chart.

Everything here works on the JSON the child processes wrote, so it can be re-run on a
saved result (``python -m benchmarks.run --report FILE``) and is unit-tested without
starting a loader.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

MB = 1e6


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """One child's result -> throughput (from its median epoch) and per-batch costs."""
    epochs = run["epochs"]
    nb = run["batches_per_epoch"]
    seconds = statistics.median(e["seconds"] for e in epochs)
    total_batches = sum(e["batches"] for e in epochs)
    out = {
        "batches_per_s": nb / seconds,
        "mb_per_s": nb * run["batch_bytes"] / seconds / MB,
        "images_per_s": nb * run["batch_size"] / seconds,
        "epoch_seconds": seconds,
        "time_to_first_batch": run["time_to_first_batch"],
        "consumer_cpu_ms": 1e3 * sum(e["consumer_thread_cpu"] for e in epochs) / total_batches,
        "main_cpu_ms": 1e3 * sum(e["main_cpu"] for e in epochs) / total_batches,
        "workers_cpu_ms": 1e3 * sum(e["workers_cpu"] for e in epochs) / total_batches,
        "duplicates": sum(e["duplicates"] for e in epochs),
        "missing": sum(e["missing"] for e in epochs),
        "checksum_ok": run.get("expected_checksum") is None or all(
            abs(e["checksum"] - run["expected_checksum"]) <= 1e-6 * max(1.0, abs(run["expected_checksum"]))
            for e in epochs if e["duplicates"] == 0),
    }
    if "getitem_ms" in run:
        out["getitem_ms"] = run["getitem_ms"]
        out["workers_beyond_getitem_ms"] = out["workers_cpu_ms"] - run["getitem_ms"]
    if "peak_pss" in run:
        out["peak_pss_mb"] = run["peak_pss"] / MB
        out["peak_pss_above_start_mb"] = (run["peak_pss"] - run["baseline_pss"]) / MB
    if "steps_alone_seconds" in run:
        out["vs_steps_alone"] = seconds / run["steps_alone_seconds"]
        out["step_ms"] = run["step_ms"]
    return out


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one (workload, loader) -> the median of each figure, and the
    throughput's spread (min and max over the runs)."""
    done = [r for r in runs if "epochs" in r]
    if not done:
        return {"skipped": next((r.get("skipped") or r.get("error") for r in runs), "no run")}
    summaries = [summarize_run(r) for r in done]
    out: dict[str, Any] = {}
    for key, value in summaries[0].items():
        values = [s[key] for s in summaries]
        if isinstance(value, bool):
            out[key] = all(values)
        elif key in ("duplicates", "missing"):
            out[key] = sum(values)
        else:
            out[key] = statistics.median(values)
    rates = [s["batches_per_s"] for s in summaries]
    out["batches_per_s_range"] = (min(rates), max(rates))
    out["runs"] = len(done)
    out["description"] = done[0].get("description", "")
    out["ordered"], out["exact"] = done[0].get("ordered", True), done[0].get("exact", True)
    return out


def ceiling_rate(workload: str, ceilings: dict[str, Any] | None, workers: int) -> tuple[float, str] | None:
    """The most a loader could reach on this workload here, in the table's unit, and what it is."""
    if not ceilings:
        return None
    cores = min(workers, ceilings["cpu_count"] or 1)
    if workload in ("transport", "transport-big", "consumer"):
        key = "transport-big" if workload == "transport-big" else "transport"
        gbs = ceilings["copy"][key]["touched"]["gb_per_s"]
        # every byte is copied twice on the way: the dataset's fresh copy, then into the batch
        return cores * gbs * 1e3 / 2, f"{cores} cores x {gbs:.1f} GB/s touched copy / 2 copies"
    if workload == "jpeg":
        c = ceilings["jpeg_one_core"]
        rate = c["images_per_s"]
        together = c.get("independent_processes_images_per_s")
        extra = (f"; {c['processes']} independent processes running it at once, no loader: {together:.0f} "
                 f"images/s = {together / (cores * rate):.2f} of that") if together else ""
        return cores * rate, f"{cores} cores x {rate:.0f} images/s (one core, same pipeline){extra}"
    return None


def unit_rate(summary: dict[str, Any], workload: str) -> float:
    return summary["images_per_s"] if workload == "jpeg" else summary["mb_per_s"]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(workload: str, rows: dict[str, dict[str, Any]], ceilings: dict[str, Any] | None,
          workers: int) -> str:
    """A markdown table for one workload."""
    unit = "images/s" if workload == "jpeg" else "MB/s"
    ceiling = ceiling_rate(workload, ceilings, workers)
    shm = rows.get("shmload", {}).get("batches_per_s")
    single = rows.get("single", {}).get("batches_per_s")
    consumer = workload == "consumer"
    head = ["loader", "batches/s [runs' range]", unit, "vs shmload", "vs single"]
    head += ["epoch / steps alone"] if consumer else ["vs ceiling"]
    head += ["1st batch s", "consumer CPU ms/b", "main CPU ms/b", "workers CPU ms/b", "peak PSS MB (+above start)",
             "checks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        if "skipped" in r:
            lines.append(f"| {name} | skipped: {r['skipped']} |" + " |" * (len(head) - 2))
            continue
        lo, hi = r["batches_per_s_range"]
        rate = unit_rate(r, workload)
        last = (f"{r['vs_steps_alone']:.2f}x" if consumer else
                f"{rate / ceiling[0]:.2f}" if ceiling else "-")
        checks = [] if r["checksum_ok"] else ["CHECKSUM MISMATCH"]
        if r["duplicates"] or r["missing"]:
            checks.append(f"{r['duplicates']} dup / {r['missing']} missing samples")
        if not r["ordered"]:
            checks.append("unordered")
        pss = (f"{r['peak_pss_mb']:.0f} (+{r['peak_pss_above_start_mb']:.0f})" if "peak_pss_mb" in r else "-")
        lines.append("| " + " | ".join([
            f"**{name}**" if name == "shmload" else name,
            f"{r['batches_per_s']:.0f} [{lo:.0f}..{hi:.0f}]" if r["batches_per_s"] >= 10 else
            f"{r['batches_per_s']:.1f} [{lo:.1f}..{hi:.1f}]",
            f"{rate:.0f}", _ratio(r["batches_per_s"], shm), _ratio(r["batches_per_s"], single), last,
            f"{r['time_to_first_batch']:.3f}", f"{r['consumer_cpu_ms']:.2f}", f"{r['main_cpu_ms']:.2f}",
            f"{r['workers_cpu_ms']:.2f}", pss, ", ".join(checks) or "ok"]) + " |")
    getitem = next((r["getitem_ms"] for r in rows.values() if "getitem_ms" in r), None)
    if getitem is not None:
        lines.append(f"\nThe dataset's __getitem__ alone: {1e3 * getitem:.0f} us of CPU per batch "
                     "(in the measuring process; workers CPU minus this is a loader's own cost).")
    if ceiling:
        lines.append(f"\nCeiling: {ceiling[0]:.0f} {unit} ({ceiling[1]}).")
    return "\n".join(lines)


def rounds_ratios(a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]]) -> list[float]:
    """Loader a's throughput over loader b's, round by round, for the rounds where both
    ran. An invocation appends its runs a round at a time (every loader once, then
    again), so the i-th runs of two loaders were measured within seconds of each other:
    on a host whose speed drifts from minute to minute, the median of these ratios is
    steadier than the ratio of the two medians, which pairs runs from different minutes."""
    out = []
    for a, b in zip(a_runs, b_runs):
        if "epochs" in a and "epochs" in b:
            rate = summarize_run(b)["batches_per_s"]
            if rate:
                out.append(summarize_run(a)["batches_per_s"] / rate)
    return out


class Rounds(NamedTuple):
    """The rounds' own ratios of a target: their median, least and greatest, and how many."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, ratios: list[float]) -> Rounds | None:
        return cls(statistics.median(ratios), min(ratios), max(ratios), len(ratios)) if ratios else None


class Target(NamedTuple):
    text: str
    value: float | None     # the measured figure (None: a loader it needs did not run)
    goal: float
    higher_is_better: bool = True
    rounds: Rounds | None = None  # for a ratio of two loaders' throughputs, with more than one round

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def line(self) -> str:
        status = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        value = "-" if self.value is None else f"{self.value:.2f}"
        text = f"- [{status}] {self.text}: {value} (goal {'>=' if self.higher_is_better else '<='} {self.goal:g})"
        r = self.rounds
        if r is not None and r.count > 1:
            text += f"; the rounds' own ratios: median {r.median:.2f}, {r.low:.2f}-{r.high:.2f} over {r.count}"
        return text


def _get(results: dict[str, dict[str, Any]], workload: str, loader: str, key: str) -> float | None:
    row = results.get(workload, {}).get(loader, {})
    return row.get(key)


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _scaled(a: float | None, factor: float) -> float | None:
    return a * factor if a is not None else None


def targets(results: dict[str, dict[str, Any]], ceilings: dict[str, Any] | None, workers: int,
            runs: dict[str, dict[str, list[dict[str, Any]]]] | None = None) -> list[Target]:
    """The issue's targets, evaluated on one run's combined results. A target is judged on
    the ratio of the medians; given the invocation's ``runs`` (workload -> loader -> its
    runs, in round order), a throughput ratio of shmload to one peer also reports the
    rounds' own ratios (:func:`rounds_ratios`)."""
    shm = lambda w, k="batches_per_s": _get(results, w, "shmload", k)  # noqa: E731
    peer = lambda w, name, k="batches_per_s": _get(results, w, name, k)  # noqa: E731

    def against(text: str, w: str, name: str, goal: float) -> Target:
        by_loader = (runs or {}).get(w, {})
        paired = Rounds.of(rounds_ratios(by_loader.get("shmload", []), by_loader.get(name, [])))
        return Target(text, _div(shm(w), peer(w, name)), goal, rounds=paired)

    tp_best = max((v for v in (peer("transport-big", "tp-runner"), peer("transport-big", "tp-map")) if v),
                  default=None)
    jpeg_ceiling = ceiling_rate("jpeg", ceilings, workers)
    out = [
        against("transport-big: shmload / torch DataLoader", "transport-big", "torch", 5),
        against("transport-big: shmload / single-process loop", "transport-big", "single", 1.5),
        Target("transport-big: shmload / best tensorpack", _div(shm("transport-big"), tp_best), 3),
        against("tiny: shmload / torch DataLoader", "tiny", "torch", 12),
        against("tiny: shmload / tensorpack MultiProcessRunnerZMQ", "tiny", "tp-runner", 1.4),
        against("rows: shmload / tensorpack MultiProcessRunnerZMQ", "rows", "tp-runner", 2.0),
        against("tiny: shmload / ZMQ pickle-5 pool (zmq-pool)", "tiny", "zmq-pool", 2.2),
        against("tiny: shmload / single-process loop", "tiny", "single", 1.25),
        Target("tiny: shmload's main-process CPU per batch, us", _scaled(shm("tiny", "main_cpu_ms"), 1e3), 25, False),
        Target("tiny: shmload's worker CPU per batch beyond the dataset's __getitem__, us",
               _scaled(shm("tiny", "workers_beyond_getitem_ms"), 1e3), 40, False),
        Target("jpeg: shmload / (workers x one-core pipeline rate)",
               _div(shm("jpeg", "images_per_s"), jpeg_ceiling[0] if jpeg_ceiling else None), 0.95),
        Target("jpeg: shmload / (workers independent processes running the pipeline, no loader)",
               _div(shm("jpeg", "images_per_s"),
                    (ceilings or {}).get("jpeg_one_core", {}).get("independent_processes_images_per_s")), 0.95),
        Target("consumer: shmload epoch / the steps alone", shm("consumer", "vs_steps_alone"), 1.10, False),
    ]
    for w in results:
        a, b = shm(w, "peak_pss_above_start_mb"), peer(w, "torch", "peak_pss_above_start_mb")
        out.append(Target(f"{w}: shmload's peak PSS above start / torch's", _div(a, b), 1, False))
        a, b = shm(w, "time_to_first_batch"), peer(w, "torch", "time_to_first_batch")
        out.append(Target(f"{w}: shmload's time to first batch / torch's", _div(a, b), 1, False))
    return out


def chart(results: dict[str, dict[str, Any]], path: str) -> str | None:
    """Bars of each loader's throughput relative to shmload, grouped by workload.
    Returns None when drawn, else why not (matplotlib is optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    workloads = [w for w in results if results[w].get("shmload", {}).get("batches_per_s")]
    loaders = sorted({name for w in workloads for name, r in results[w].items() if "batches_per_s" in r},
                     key=lambda n: (n != "shmload", n))
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(workloads), 4.2))
    width = 0.8 / max(1, len(loaders))
    for k, name in enumerate(loaders):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            r = results[w].get(name, {})
            if "batches_per_s" in r:
                xs.append(i + (k - (len(loaders) - 1) / 2) * width)
                ys.append(r["batches_per_s"] / results[w]["shmload"]["batches_per_s"])
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("throughput relative to shmload")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("batches/s relative to shmload (median of runs; log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
