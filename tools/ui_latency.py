"""Where the seconds go between a click on Generate and a filled Rounds panel, in Debian's Chromium.

``python tools/ui_latency.py [--family NAME] [--runs N] [--json PATH]`` serves the app in this
process, clicks Generate for ``--runs`` seeds (each new: no cached result), and reports per click:
the engine's own seconds (AR + MuLo-SD traces' wall time), the first canvas on screen, the final
statistics, the filled Rounds panel, and the panel's time over the engine's. Run it with nothing
else on the machine; a ratio is meaningful only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from browser import chromium_or_none  # tools/browser.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
# Checked every 50 ms: Playwright's default checks on every animation frame, and that polling took
# a share of the two cores from the app it measures
POLL = dict(polling=50, timeout=120_000)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=None, help="the app's family (default: the app's default)")
    parser.add_argument("--prompt", default="red apple")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    parser.add_argument(
        "--handler-threads",
        action="store_true",
        help="run the torch work on gradio's handler threads, as the app did before mulo.ui.torch_thread",
    )
    args = parser.parse_args(argv)
    chromium = chromium_or_none()
    if chromium is None:
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    if args.family:
        os.environ["MULO_FAMILY"] = args.family
    sys.path.insert(0, str(ROOT))
    import app
    from mulo.ui import engines
    from mulo.ui.torch_thread import TORCH

    if not args.handler_threads:
        TORCH.claim()  # as `python app.py` does: this thread runs the torch work, the browser is driven beside it
    engines.engine_for(engines.DEFAULT_FAMILY)  # loaded and warmed before the first click, as `python app.py` does
    app.warm_up()
    demo = app.build_demo().queue(max_size=4)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=7875, quiet=True,
                            **app.LAUNCH_KW)  # fmt: skip
    rows, failure, stop = [], [], threading.Event()

    def drive():
        try:
            click_through(url, chromium, args, rows)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            stop.set()

    try:
        if args.handler_threads:
            drive()
        else:
            threading.Thread(target=drive, name="browser").start()
            TORCH.serve(stop)
    finally:
        demo.close()
    if failure:
        raise failure[0]
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "seed"}
    print("median: " + " ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    if args.json:
        torch_work = "handler threads" if args.handler_threads else "one torch thread"
        args.json.write_text(json.dumps({"family": engines.DEFAULT_FAMILY, "torch_work": torch_work, "runs": rows,
                                         "median": summary}, indent=1))  # fmt: skip
    return 0


def click_through(url, chromium, args, rows) -> None:
    """Click Generate for ``args.runs`` new seeds; append one row of timings per click."""
    from playwright.sync_api import sync_playwright

    from mulo.ui import handlers

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.locator("#canvas").scroll_into_view_if_needed()  # the panel's images load once in view
        page.locator("#prompt textarea, #prompt input").first.fill(args.prompt)
        for seed in range(1, args.runs + 1):
            page.locator("#seed textarea, #seed input").first.fill(str(1000 + seed))
            old = page.evaluate("() => document.querySelector('#canvas img')?.src || ''")
            before = len(handlers.RESULTS.entries)
            start, browser_cpu = time.perf_counter(), chromium_cpu_s()
            page.locator("#generate").click()
            page.wait_for_function("() => !!document.querySelector('#mulo img, #ar img')", **POLL)
            first_image = time.perf_counter() - start
            page.wait_for_function("s => (document.querySelector('#stats-mulo')?.textContent || '').includes(s)",
                                   arg=f"seed {1000 + seed}", **POLL)  # fmt: skip
            stats = time.perf_counter() - start
            page.wait_for_function("old => { const i = document.querySelector('#canvas img'); "
                                   "return !!i && i.src !== old && i.complete && i.naturalWidth > 0; }",
                                   arg=old, **POLL)  # fmt: skip
            panel, browser_cpu = time.perf_counter() - start, chromium_cpu_s() - browser_cpu
            if len(handlers.RESULTS.entries) <= before:
                raise RuntimeError("the request was answered from the cache: use new seeds")
            views = list(handlers.RESULTS.entries.values())[-1]
            engine_s = sum(views[label].trace.latency_s for label in ("AR", "MuLo-SD"))
            rows.append(dict(seed=1000 + seed, engine_s=engine_s, first_image_s=first_image, stats_s=stats,
                             panel_s=panel, panel_over_engine=panel / engine_s, browser_cpu_s=browser_cpu))  # fmt: skip
            print(" ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()))
        browser.close()


def chromium_cpu_s() -> float:
    """CPU seconds used so far by this machine's Chromium processes: the browser shares the two
    cores with the app here, where a visitor's browser runs on the visitor's machine."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if "chrom" in name:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


if __name__ == "__main__":
    sys.exit(main())
