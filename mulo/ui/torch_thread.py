"""The app's torch work, all of it on one thread: the one that calls ``TORCH.serve`` (the main
thread of ``python app.py``).

Why one thread: torch's CPU kernels and the compiled step packages parallelise with OpenMP, and
GNU OpenMP gives each thread that opens a parallel region a team of its own, kept while that thread
lives. Gradio runs handlers on a pool of threads. Once a second thread has a team beside the main
thread's, the process manages more OpenMP threads than the machine has cores, and libgomp then
stops spinning between parallel regions (its throttled spin count): every small kernel waits for
sleeping workers to be woken. Measured on a 2-core machine: a [1, 256] x [256, 768] product takes
9 us on the thread that loaded torch and 173 us on a second thread; AR + MuLo-SD on "red apple"
1.8 s on the main thread, 6.2 s on a second one (``OMP_WAIT_POLICY=active`` keeps them spinning
instead, at the price of a core spun away whenever the app is idle).

Without a serving thread (tests, scripts, a ZeroGPU worker forked from the app), ``call`` and
``stream`` run the work where they are asked for, as a plain call would.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future


class TorchThread:
    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._owner: tuple[int, int] | None = None  # (pid, thread id) of the serving thread
        # Streams run one at a time: a suspended engine stream holds its engine's lock, and a second
        # stream's step would wait for that lock on the very thread that must resume the first.
        self._streams = threading.Lock()

    @property
    def serving(self) -> bool:
        return self._owner is not None and self._owner[0] == os.getpid()

    def _here(self) -> bool:
        """Whether work asked for now runs where it is asked for."""
        return not self.serving or self._owner[1] == threading.get_ident()

    def claim(self) -> None:
        """Make the calling thread the one that runs the torch work: from now on other threads'
        work waits for it to ``serve``."""
        self._owner = (os.getpid(), threading.get_ident())

    def serve(self, stop: threading.Event) -> None:
        """Run the work that other threads hand over until ``stop`` is set; work still queued
        then runs too, so that no caller waits forever."""
        self.claim()
        try:
            while not stop.is_set():
                try:
                    job = self._jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                _run(*job)
        finally:
            self._owner = None
            self._drain()  # asked for before _owner was cleared

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the serving thread; its result or its exception here."""
        if self._here():
            return fn(*args, **kwargs)
        future = Future()
        self._jobs.put((future, fn, args, kwargs))
        if not self.serving:  # serving ended between the check and the put: nobody would run it
            self._drain()
        return future.result()

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            _run(*job)

    def stream(self, generator):
        """Iterate ``generator`` on the serving thread, yielding its items here; return its value.
        Closing this stream (a cancelled request) closes ``generator`` on the serving thread."""
        if self._here():
            return (yield from generator)
        with self._streams:
            try:
                while True:
                    finished, item = self.call(_step, generator)
                    if finished:
                        return item
                    yield item
            finally:
                self.call(generator.close)


def _step(generator) -> tuple[bool, object]:
    try:
        return False, next(generator)
    except StopIteration as stop:  # a StopIteration must not cross into the caller's generator
        return True, stop.value


def _run(future: Future, fn, args, kwargs) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # handed to the caller; Ctrl-C still stops the serving thread
        future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise


TORCH = TorchThread()
