"""Browser tests: Playwright driving Debian's Chromium (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import worker_port

CHROMIUM = os.environ.get("CHROMIUM_PATH", shutil.which("chromium") or "/usr/bin/chromium")


def pytest_collection_modifyitems(config, items):
    # This hook sees every item of the session, not just this folder's: skip the browser tests only.
    if not os.path.exists(CHROMIUM):
        skip = pytest.mark.skip(reason=f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
        for item in items:
            if item.get_closest_marker("e2e") is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ],
    }


@pytest.fixture(scope="session")
def app_url():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import app
    from mulo.families import ASSETS_ROOT
    from mulo.ui import engines, handlers

    if not (ASSETS_ROOT / engines.DEFAULT_FAMILY / "target.safetensors").exists():
        engines.DEFAULT_FAMILY = "toy"  # the trained family is not installed: drive the UI on random weights
    handlers.PLAY_SECONDS = 0.1  # a visitor gets 0.7 s a round to read; the tests only follow it to the end
    demo = app.build_demo().queue(max_size=16)
    _, url, _ = demo.launch(
        prevent_thread_lock=True, server_name="127.0.0.1", server_port=worker_port(7873), quiet=True, **app.LAUNCH_KW
    )
    yield url
    demo.close()


@pytest.fixture
def page(page):
    # Beside the other test worker on two cores, a click on a busy page can take longer than
    # Playwright's default 30 s (a download link once did).
    page.set_default_timeout(90_000)
    return page
