"""Ctrl-C ends ``python app.py`` within seconds, whatever its main thread is doing.

Python runs its SIGINT handler (the ``KeyboardInterrupt``) only when the main thread next runs
bytecode, and the app's main thread serves torch work (``mulo.ui.torch_thread``): stuck in native
code, it would never see the signal. The C-level handler also writes the signal's number to a
wake-up pipe (``signal.set_wakeup_fd``); a thread waiting on that pipe ends the process once the
grace period is over, if the main thread has not ended it first.
"""

from __future__ import annotations

import os
import signal
import threading
import time

EXIT_CODE = 130  # a shell's code for a process ended by SIGINT


def exit_on_ctrl_c(grace: float = 10.0) -> None:
    """From now on, ``grace`` seconds after a SIGINT the process exits (code 130). Call it from
    the main thread (``set_wakeup_fd``'s rule), once."""
    # A process started from a shell's background job inherits SIGINT ignored, and Python then
    # installs no handler: a server stops on SIGINT whatever its parent did (as uvicorn does)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch() -> None:
        while os.read(read, 1) != bytes([signal.SIGINT]):
            pass  # another signal Python handles: not ours
        time.sleep(grace)
        os._exit(EXIT_CODE)

    threading.Thread(target=watch, daemon=True, name="ctrl-c watchdog").start()
