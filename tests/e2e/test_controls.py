"""What a visitor does with the Rounds panel, in a real browser, watching for any error toast:
switch between runs of different round counts, step, play, replay a trace, stop a generation,
click tokens; and on a phone's width, AR and MuLo-SD side by side."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.test_ui import set_slider

pytestmark = pytest.mark.slow  # a browser drives the served app (docs/testing.md)

# Every toast gradio shows is recorded as it appears (they vanish after a few seconds).
RECORD_TOASTS = """
window.__toasts = [];
new MutationObserver(() => {
  for (const el of document.querySelectorAll('[data-testid="toast-body"]')) {
    if (!el.__seen) { el.__seen = true; window.__toasts.push(el.className + ': ' + el.innerText); }
  }
}).observe(document, {subtree: true, childList: true});
"""


def toasts(page: Page) -> list[str]:
    return page.evaluate("window.__toasts || []")


def choose(page: Page, label: str, option: str) -> None:
    page.get_by_label(label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()


def rounds_shown(page: Page) -> tuple[int, int]:
    """(round shown, rounds of the run) from the round line, once it names both."""
    info = page.locator("#round-info")
    expect(info).to_contain_text(re.compile(r"round \d+ / \d+"), timeout=60_000)
    shown, total = re.search(r"round (\d+) / (\d+)", info.inner_text()).groups()
    return int(shown), int(total)


def pick_run(page: Page, name: str) -> int:
    """Choose run ``name`` in the Rounds panel; returns its number of rounds once shown at round 1."""
    page.locator("#run-pick").get_by_label(name, exact=True).check()
    shown = re.compile(rf"(?<![\w-]){re.escape(name)} · round (\d+) / (\d+)")  # "SD", not "MuLo-SD"
    expect(page.locator("#round-info")).to_contain_text(shown, timeout=30_000)
    page.wait_for_timeout(500)  # the slider's range arrives with the same event
    # read it once it holds still at round 1: a redraw queued by the last run's controls may land
    # after the switch and show the run at the last run's round; "previous" brings it back to 1
    for _ in range(60):
        found = shown.search(page.locator("#round-info").inner_text())
        if found and found.group(1) == "1":
            return int(found.group(2))
        if found:
            page.locator("#previous").click()
        page.wait_for_timeout(500)
    raise AssertionError(f"the round line never showed {name} at round 1")


def settled_rounds(page: Page) -> int:
    """The shown run's round count once the round line holds still with no event running (after a
    stop, the stopped generation's last update can land seconds later on a busy machine)."""
    info, last, still = page.locator("#round-info"), None, 0
    for _ in range(120):
        text = info.inner_text()
        found = re.search(r"round \d+ / (\d+)", text)
        busy = "processing" in text or re.match(r"\s*\d+(\.\d+)?s\b", text)  # gradio's progress line
        current = None if busy or not found else int(found.group(1))
        still = still + 1 if current is not None and current == last else 0
        if still >= 4:  # the same run for 2 s
            return current
        last = current
        page.wait_for_timeout(500)
    raise AssertionError(f"the round line never held still: {info.inner_text()!r}")


def step_and_play(page: Page, total: int) -> None:
    """next twice (or to the end), then play to the last round; the round line follows."""
    info = page.locator("#round-info")
    for want in range(2, min(total, 3) + 1):
        page.locator("#next").click()
        expect(info).to_contain_text(f"round {want} / {total}", timeout=30_000)
    page.locator("#play").click()
    expect(info).to_contain_text(f"round {total} / {total}", timeout=60_000 + 1_000 * total)
    page.locator("#next").click()  # past the end: stays on the last round
    page.wait_for_timeout(800)
    expect(info).to_contain_text(f"round {total} / {total}")


@pytest.mark.e2e
def test_switch_runs_step_play_replay_stop_without_an_error(page: Page, app_url):
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.add_init_script(RECORD_TOASTS)
    page.goto(app_url)
    expect(page.locator("#column-third")).to_be_hidden()
    page.get_by_text("Advanced", exact=True).click()
    choose(page, "family", "toy")  # random weights: every method in seconds
    page.wait_for_timeout(1_000)  # the family's knob values arrive
    set_slider(page, "rows per block", "2")
    choose(page, "third column", "EAGLE-2")
    expect(page.locator("#column-third")).to_be_visible(timeout=10_000)
    expect(page.locator("#title-third")).to_contain_text("EAGLE-2")
    page.locator("#generate").click()
    expect(page.locator("#stats-third")).to_contain_text("cost", timeout=120_000)
    expect(page.locator("#round-info")).to_contain_text("MuLo-SD · round 1 /", timeout=60_000)
    rounds = {"MuLo-SD": rounds_shown(page)[1]}
    for name in ("AR", "EAGLE-2", "MuLo-SD", "AR"):  # round counts differ: 1 or 2 rounds vs 8 vs many
        rounds[name] = pick_run(page, name)
        step_and_play(page, rounds[name])
    assert len(set(rounds.values())) >= 2, rounds
    # a token clicked is outlined and described; switching runs clears it
    page.locator("#token-map img").click(position={"x": 40, "y": 40})
    expect(page.locator("#token-info")).to_contain_text("token (row", timeout=30_000)

    # replay a bundled trace: a run of its own in the same panel
    page.get_by_role("tab", name="Replay a trace").click()
    page.get_by_label("bundled example traces").click()
    page.get_by_role("option").first.click()
    page.locator("#load").click()
    summary = page.locator("#replay-summary")
    expect(summary).to_contain_text(re.compile(r"\d+ rounds"), timeout=60_000)
    replayed = int(re.search(r"(\d+) rounds", summary.inner_text()).group(1))
    expect(page.locator("#round-info")).to_contain_text(f"round 1 / {replayed}", timeout=60_000)
    step_and_play(page, replayed)

    # stop a generation half way: the panel keeps the last finished run and still steps
    page.get_by_role("tab", name="Generate").click()
    page.locator("#generate").click()
    page.wait_for_timeout(300)
    page.locator("#stop").click()
    step_and_play(page, settled_rounds(page))
    assert not errors, errors
    assert not toasts(page), toasts(page)


@pytest.mark.e2e
def test_on_a_phone_ar_and_mulo_sit_side_by_side(browser, app_url):
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.add_init_script(RECORD_TOASTS)
        page.goto(app_url)
        expect(page.locator("#column-third")).to_be_hidden()
        page.locator("#generate").click()
        expect(page.locator("#stats-mulo")).to_contain_text("wall-clock", timeout=120_000)
        ar, mulo = page.locator("#ar img").bounding_box(), page.locator("#mulo img").bounding_box()
        assert abs(ar["y"] - mulo["y"]) < 5 and mulo["x"] >= ar["x"] + ar["width"] - 1, (ar, mulo)
        assert mulo["x"] + mulo["width"] <= 390 + 1  # both fit the screen's width
        assert not toasts(page), toasts(page)
    finally:
        page.close()


@pytest.mark.e2e
def test_every_baselines_rounds_step_and_play_and_the_map_controls_redraw(page: Page, app_url):
    """Each baseline as the third column (ZipAR, SJD, SD, LANTERN; EAGLE-2 above): its rounds step
    and play to the end; layers and opacity redraw the maps; no error anywhere."""
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.add_init_script(RECORD_TOASTS)
    page.goto(app_url)
    page.get_by_text("Advanced", exact=True).click()
    choose(page, "family", "toy")
    page.wait_for_timeout(1_000)
    for name in ("ZipAR", "SJD", "SD", "LANTERN"):
        choose(page, "third column", name)
        expect(page.locator("#title-third")).to_contain_text(name, timeout=10_000)
        page.locator("#generate").click()
        expect(page.locator("#stats-third")).to_contain_text(name, timeout=120_000)
        # the panel first shows MuLo-SD's rounds, as a visitor sees them before choosing a run
        expect(page.locator("#round-info")).to_contain_text("MuLo-SD · round 1 /", timeout=60_000)
        step_and_play(page, pick_run(page, name))
    pick_run(page, "MuLo-SD")  # its first round rejects drafts on the toy family: a layer to switch off
    token_map = page.locator("#token-map img")
    before = token_map.get_attribute("src")  # files are named by content: a new picture, a new address
    page.locator("#layers").get_by_label("rejected", exact=True).uncheck()
    expect(token_map).not_to_have_attribute("src", before, timeout=30_000)  # redrawn without a layer
    page.locator("#layers").get_by_label("rejected", exact=True).check()
    overlay = page.locator("#overlay img")
    before = overlay.get_attribute("src")
    set_slider(page, "overlay opacity", "0.9")
    page.get_by_label("range slider for overlay opacity").dispatch_event("pointerup")  # a release redraws
    expect(overlay).not_to_have_attribute("src", before, timeout=30_000)
    assert not errors, errors
    assert not toasts(page), toasts(page)
