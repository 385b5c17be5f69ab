"""Regenerate docs/ui.png and docs/round.png: the app in Debian's Chromium, "grinning face", seed 0,
the default family's default settings, after one Generate: the page, and the slide figure of
MuLo-SD's first round as the "PNG figure of this round" button exports it.
``python tools/ui_screenshot.py [--out PATH] [--figure PATH]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from browser import chromium_or_none  # tools/browser.py, beside this file

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui.png")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "round.png")
    parser.add_argument("--prompt", default="grinning face")
    args = parser.parse_args(argv)
    chromium = chromium_or_none()
    if chromium is None:
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import expect, sync_playwright

    import app

    demo = app.build_demo().queue(max_size=4)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=7874, quiet=True,
                            **app.LAUNCH_KW)  # fmt: skip
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.locator("#prompt textarea, #prompt input").first.fill(args.prompt)
            page.locator("#seed textarea, #seed input").first.fill("0")
            page.get_by_role("button", name="Generate", exact=True).click()
            expect(page.locator("#stats-mulo")).to_contain_text("wall-clock", timeout=120_000)
            expect(page.locator("#round-info")).to_contain_text("round 1 /", timeout=60_000)
            for key in ("ar", "mulo", "draft", "islands", "canvas", "export"):  # images load once in view
                page.locator(f"#{key}").scroll_into_view_if_needed()
                page.wait_for_timeout(500)
            page.wait_for_timeout(2000)  # the round panel's images decode
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            # the slide figure, as "PNG figure of this round" exports it for this request's MuLo-SD run
            from mulo.ui import handlers

            views = list(handlers.RESULTS.entries.values())[-1]
            exported = handlers.export_figure({"views": views, "order": list(views)}, "MuLo-SD", 0)
            shutil.copyfile(exported, args.figure)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out} and {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
