"""`python app.py` serves the demo on the host and port it is given, answers a request, stops on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow  # the app served in a process of its own (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stuck(proc: subprocess.Popen, log: Path) -> str:
    """What a process that did not stop was doing: its signal state, its Python stacks (py-spy,
    when installed) and the end of its log."""
    status = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Sig")]
    stacks = ""
    if shutil.which("py-spy"):
        stacks = subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], capture_output=True, text=True).stdout
    return f"{status}\n{stacks}\n{log.read_text()[-3000:]}"


def test_python_app_py_serves_the_page(tmp_path):
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", MULO_FAMILY="toy", HF_HUB_OFFLINE="1")
    log = tmp_path / "app.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
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
        assert proc.poll() is None, log.read_text()
        assert page is not None and "gradio" in page.lower()
        info = urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/info", timeout=10).read().decode()
        assert "/generate" in info
        # a request: its models run on the main thread (mulo.ui.torch_thread), which serves them
        client = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        final = client.submit("red apple", "5", api_name="/generate").result(timeout=120)
        assert "seed 5" in final[4] and "wall-clock" in final[4]  # MuLo-SD's statistics
        proc.send_signal(signal.SIGINT)  # Ctrl-C stops the serving loop and closes the app
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"app.py outlived Ctrl-C by 30 s:\n{stuck(proc, log)}")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_ctrl_c_ends_the_process_even_when_the_main_thread_never_sees_it():
    """A main thread that does not end on Ctrl-C (here its SIGINT handler does nothing; stuck in
    native code, it would never run one): the watchdog of ``mulo.ui.shutdown`` ends the process
    after the grace period, with a SIGINT's exit code."""
    script = (
        "import signal, time\n"
        "from mulo.ui.shutdown import exit_on_ctrl_c\n"
        "exit_on_ctrl_c(grace=0.5)\n"
        "signal.signal(signal.SIGINT, lambda *args: None)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        assert time.monotonic() - start >= 0.5  # not before the grace period
    finally:
        proc.kill()
        proc.wait(timeout=10)
