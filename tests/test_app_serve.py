"""`python app.py` serves the demo on the host and port it is given, answers a request, stops on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gradio_client import Client

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
        # a request: its models run on the main thread (mulo.ui.torch_thread), which serves them
        client = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        final = client.submit("red apple", "5", api_name="/generate").result(timeout=120)
        assert "seed 5" in final[4] and "wall-clock" in final[4]  # MuLo-SD's statistics
        proc.send_signal(signal.SIGINT)  # Ctrl-C stops the serving loop and closes the app
        assert proc.wait(timeout=30) is not None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
