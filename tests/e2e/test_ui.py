"""The demo in a real browser: generate, images decode, scrub rounds, click a token, download."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.slow  # a browser drives the served app (docs/testing.md)

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def decoded(page: Page, selector: str, timeout: float = 30_000) -> bool:
    """The image at ``selector`` finished loading and has pixels (waits: a new round swaps the
    image source, and the browser decodes it a moment after it becomes visible)."""
    script = "s => { const i = document.querySelector(s); return !!i && i.complete && i.naturalWidth > 0; }"
    page.wait_for_function(script, arg=selector, timeout=timeout)
    return True


def set_slider(page: Page, label: str, value: str) -> None:
    """Type ``value`` into a gradio slider's number box until the slider's range input shows it
    too, and still does a moment later (both read the component's value; a box typed into before
    the page has hydrated loses it, once even after the range input had shown it: a cold start
    in CI generated with the family's value)."""
    box = page.get_by_label(f"number input for {label}")
    track = page.get_by_label(f"range slider for {label}")
    for _ in range(40):
        box.fill(value)
        box.blur()
        if track.input_value() == value:
            page.wait_for_timeout(750)
            if track.input_value() == value and box.input_value() == value:
                return
        page.wait_for_timeout(250)
    raise AssertionError(f"the {label} slider did not take {value} (shows {track.input_value()})")


@pytest.mark.e2e
def test_generate_scrub_click_download(page: Page, app_url):
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_url)
    # two low-res rows per round instead of the family's whole image: several rounds to scrub
    page.get_by_text("Advanced", exact=True).click()
    set_slider(page, "rows per block", "2")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.get_by_text("Advanced", exact=True).click()  # closed again: the results come into view
    page.locator("#column-ar").scroll_into_view_if_needed()  # images load lazily, once in view
    expect(page.locator("#ar img")).to_be_visible(timeout=60_000)
    expect(page.locator("#mulo img")).to_be_visible(timeout=60_000)
    expect(page.locator("#stats-mulo")).to_contain_text("wall-clock", timeout=60_000)
    assert decoded(page, "#ar img") and decoded(page, "#mulo img")

    # the round panel is filled for MuLo-SD; scrubbing changes the round shown
    info = page.locator("#round-info")
    expect(info).to_contain_text(re.compile(r"round 1 / ([2-9]|[1-9][0-9])\b"), timeout=30_000)  # several rounds
    page.locator("#next").click()
    expect(info).to_contain_text("round 2 /", timeout=30_000)
    expect(page.locator("#token-map img")).to_be_visible()
    assert decoded(page, "#token-map img")

    # clicking a token of the acceptance map shows its history
    page.locator("#token-map img").click(position={"x": 20, "y": 200})
    expect(page.locator("#token-info")).to_contain_text("token (row", timeout=30_000)

    # the trace downloads as a file
    page.get_by_text("Trace JSON").click()
    with page.expect_download(timeout=90_000) as download:  # beside the other worker it can take >30 s
        page.locator("#downloads a").first.click()
    assert download.value.suggested_filename.startswith("trace-")

    # the legend under the maps counts what MuLo-SD's trace holds for the round shown (round 2)
    from mulo.tracefile import read_trace_file
    from mulo.ui import viz

    with page.expect_download(timeout=90_000) as download:  # beside the other worker it can take >30 s
        page.locator("#downloads a[href*='trace-mulo']").first.click()
    trace = read_trace_file(download.value.path())
    counts = viz.legend_counts(trace.rounds[1])
    legend = info.inner_text()
    assert f"accepted, kept {counts['accepted_kept']}" in legend, legend
    assert f"accepted, re-opened by a neighbour {counts['accepted_reopened']}" in legend
    assert f"rejected {counts['rejected']}" in legend and f"re-opened and resampled {counts['reopened']}" in legend

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)
    assert not errors, errors


@pytest.mark.e2e
def test_a_trace_with_markup_shows_it_as_text(page: Page, app_url, tmp_path):
    from mulo.engine import Engine
    from mulo.families import toy

    markup = (
        '<img src="https://evil.example/beacon.png"> [CLICK HERE TO LOG IN](https://evil.example) <form><input></form>'
    )
    data = Engine(toy.build()).generate("red apple", "ar", 0).trace.to_dict()
    data.update(prompt=markup, warnings=[f"see www.evil.example {markup}"])
    path = tmp_path / "markup.json"
    path.write_text(json.dumps(data))
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(app_url)
    page.get_by_role("tab", name="Replay a trace").click()
    page.locator("#trace-upload input[type=file]").set_input_files(str(path))
    page.locator("#load").click()
    summary = page.locator("#replay-summary")
    expect(summary).to_contain_text("CLICK HERE TO LOG IN", timeout=60_000)
    text = summary.inner_text()
    assert '<img src="https://evil.example/beacon.png">' in text and "[CLICK HERE TO LOG IN](" in text
    assert summary.locator("img, a, form, input").count() == 0  # nothing rendered as markup
    assert not any("evil.example" in url for url in requested)
