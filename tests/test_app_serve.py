"""`python app.py` serves the demo on the host and port it is given."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_python_app_py_serves_the_page():
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", MULO_FAMILY="toy", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, page = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()
        assert page is not None and "gradio" in page.lower()
        info = urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/info", timeout=10).read().decode()
        assert "/generate" in info
    finally:
        proc.terminate()
        proc.wait(timeout=30)
