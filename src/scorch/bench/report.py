"""Output of the benchmark suite: the markdown table, the JSON file, the speedup bar chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

COLUMNS = ("workload", "system", "median ms", "speedup", "peak RSS MB (+ during case)", "note")


def add_malloc_option(ap) -> None:
    """``--default-malloc`` on an argparse parser (this suite and the scripts in benchmarks/)."""
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc as it is (default: keep freed large blocks for reuse, for every "
                         "system alike; see scorch.runtime.keep_freed_memory)")


def apply_malloc_option(args) -> str:
    """Apply ``--default-malloc`` (or not) and describe the allocator for the header line."""
    from .. import runtime
    if not args.default_malloc and runtime.keep_freed_memory():
        return "malloc keeps freed large blocks (scorch.runtime.keep_freed_memory)"
    return "default malloc (outputs over 32 MiB are fresh mmaps)"


def _fmt_ms(t):
    if t is None:
        return "-"
    return f"{t:.3f}" if t < 10 else f"{t:.1f}"


def format_table(rows) -> str:
    """A markdown table, one line per row: ``workload`` is the case name (``group: case``);
    speedup is ``baseline median / median`` (the baseline the faster of the case's baseline
    systems, e.g. the torch.sparse CSR and COO routes); errors go in the note column."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        sp = r.get("speedup")
        note = ""
        if r.get("error"):
            note = "ERROR: " + str(r["error"]).replace("|", "/").replace("\n", " ")
        elif r.get("is_baseline"):
            note = "baseline"
        rss = r.get("peak_rss_mb")
        lines.append("| " + " | ".join([
            f"{r['workload']}: {r['case']}", r["system"], _fmt_ms(r.get("median_ms")),
            "-" if sp is None else f"{sp:.2f}x",
            "-" if rss is None or (isinstance(rss, float) and math.isnan(rss))
            else f"{rss:.0f} (+{r.get('rss_delta_mb') or 0:.0f})",
            note]) + " |")
    return "\n".join(lines)


def format_summary(rows) -> str:
    """A markdown table, one line per case: scorch's median, the baseline's, the speedup, and
    every other system's speedup over the same baseline."""
    cases = {}
    for r in rows:
        cases.setdefault((r["workload"], r["case"]), []).append(r)
    lines = ["| case | scorch ms | baseline ms | speedup | other systems (speedup over the same baseline) |",
             "|---|---|---|---|---|"]
    for (w, case), rs in cases.items():
        ours = next((r for r in rs if r["system"].startswith("scorch")), None)
        base = [r for r in rs if r.get("is_baseline") and r.get("median_ms") is not None]
        if ours is None or not base:
            continue
        b = min(base, key=lambda r: r["median_ms"])
        others = ", ".join(f"{r['system']} {r['speedup']:.2f}x" for r in rs
                           if r is not ours and r is not b and r.get("speedup"))
        sp = "-" if ours.get("speedup") is None else f"**{ours['speedup']:.2f}x**"
        lines.append(f"| {w}: {case} | {_fmt_ms(ours.get('median_ms'))} | {_fmt_ms(b['median_ms'])} ({b['system']}) "
                     f"| {sp} | {others} |")
    return "\n".join(lines)


def geomean_summary(rows) -> str:
    """Geometric-mean speedup of scorch over the baseline per workload group."""
    by = {}
    for r in rows:
        if r["system"].startswith("scorch") and r.get("speedup"):
            by.setdefault(r["workload"], []).append(r["speedup"])
    return "\n".join(f"{w}: scorch geometric-mean speedup {math.exp(sum(map(math.log, v)) / len(v)):.2f}x "
                     f"over {len(v)} cases" for w, v in by.items())


def write_json(rows, path, meta=None) -> None:
    Path(path).write_text(json.dumps({"meta": meta or {}, "rows": rows}, indent=1, default=str))


def write_plot(rows, path) -> str:
    """A horizontal bar chart of the speedups (log scale, 1x marked); returns a message."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return f"--plot {path}: matplotlib is not importable, no plot written (pip install matplotlib)"
    pts = [(f"{r['case']} [{r['system']}]", r["speedup"]) for r in rows if r.get("speedup")]
    if not pts:
        return f"--plot {path}: no timed rows, no plot written"
    fig, ax = plt.subplots(figsize=(10, max(3, 0.22 * len(pts))))
    labels, vals = zip(*pts)
    ax.barh(range(len(vals)), vals, color=["tab:blue" if "scorch" in lab else "tab:gray" for lab in labels])
    ax.set_yticks(range(len(vals)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("speedup vs the case's baseline (higher is faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"
