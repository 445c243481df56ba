"""``python -m scorch.bench [--quick] [--json FILE] [--plot FILE.png] [--data DIR] [--only NAME...]``"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import scorch

from .report import (add_malloc_option, apply_malloc_option, format_summary, format_table, geomean_summary,
                     write_json, write_plot)
from .workloads import WORKLOADS, run_case


@dataclass
class Config:
    quick: bool
    data: Path | None
    dense_max_nodes: int = 20_000


def default_data() -> str | None:
    env = os.environ.get("SCORCH_DATA")
    if env:
        return env
    repo = Path(scorch.__file__).resolve().parents[2]          # src/scorch/__init__.py -> repo
    cand = repo.parent / "shared" / "data"
    return str(cand) if cand.is_dir() else None


def _progress(total):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc="bench", unit="case", file=sys.stderr, leave=False)
    except Exception:  # noqa: BLE001
        return None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scorch.bench", description="scorch benchmark suite")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (< 2 min on 2 cores)")
    ap.add_argument("--json", metavar="FILE", help="write all rows as JSON")
    ap.add_argument("--plot", metavar="FILE.png", help="bar chart of speedups (needs matplotlib)")
    ap.add_argument("--data", default=default_data(), help="directory of the real graphs (.npz)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(WORKLOADS),
                    help=f"run only these workloads ({', '.join(WORKLOADS)})")
    ap.add_argument("--repeat", type=_positive, default=None, help="timed rounds per case (default 10 quick, 20 full)")
    ap.add_argument("--dense-kernels", choices=("auto", "compiled", "torch"), default="auto",
                    help="the dense x @ W^T inside scorch's layers: the faster of scorch's generated kernel and "
                         "torch's, measured per shape (auto, default), or one of them always; 'torch' shows "
                         "what the sparse kernels alone gain (scorch.config.dense_kernels)")
    add_malloc_option(ap)
    args = ap.parse_args(argv)
    if args.plot and not args.plot.lower().endswith((".png", ".pdf", ".svg")):
        ap.error(f"--plot: expected a .png, .pdf or .svg file name, got {args.plot!r}")   # before the run, not after
    malloc = apply_malloc_option(args)

    scorch.config.dispatch = "sparse"       # measure scorch's kernels, never the runtime's switch to dense
    scorch.config.dense_kernels = args.dense_kernels
    cfg = Config(quick=args.quick, data=Path(args.data) if args.data else None)
    repeat = args.repeat or (10 if args.quick else 20)
    budget = 2.0 if args.quick else 20.0     # seconds of timed rounds per case, at most
    names = args.only or list(WORKLOADS)
    print(f"scorch bench: torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, "
          f"{'quick' if args.quick else 'full'}, data={cfg.data}, {malloc}, dense products in layers: "
          f"{args.dense_kernels}", file=sys.stderr)

    t0 = time.perf_counter()
    rows = []
    bar = _progress(None)
    for wname in names:
        try:
            cases = WORKLOADS[wname](cfg)
            for case in cases:
                if bar is not None:
                    bar.set_postfix_str(case.name[:40])
                else:
                    print(f"[bench] {wname}: {case.name}", file=sys.stderr, flush=True)
                rows.extend(run_case(case, repeat, budget))
                if bar is not None:
                    bar.update(1)
        except Exception as e:  # noqa: BLE001  (building a workload's inputs failed)
            rows.append({"workload": wname, "case": "(setup)", "system": "-", "median_ms": None, "speedup": None,
                         "baseline": "", "is_baseline": False, "peak_rss_mb": None, "rss_delta_mb": None,
                         "error": f"{type(e).__name__}: {e}"[:300]})
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - t0

    print(format_table(rows))
    print()
    print(format_summary(rows))
    print()
    print(geomean_summary(rows))
    print(f"\n{len(rows)} rows, {sum(1 for r in rows if r.get('error'))} errors, {elapsed:.1f} s. "
          "Speedup = baseline median / median (baseline: faster of the case's baseline systems); "
          "peak RSS = the process's high-water mark after the case (getrusage).")
    if args.json:
        write_json(rows, args.json, {"torch": torch.__version__, "threads": torch.get_num_threads(),
                                     "quick": args.quick, "elapsed_s": elapsed, "data": str(cfg.data),
                                     "malloc": malloc, "dense_kernels": args.dense_kernels})
        print(f"JSON written to {args.json}")
    if args.plot:
        print(write_plot(rows, args.plot))
    return 1 if any(r["case"] == "(setup)" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
