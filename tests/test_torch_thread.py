"""The app's torch work on one thread (mulo.ui.torch_thread): where work runs, what comes back,
streams that hold a lock across their rounds, cancellation, the end of serving."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from mulo.streams import Returning
from mulo.ui import engines, handlers, views
from mulo.ui.torch_thread import TORCH, TorchThread


class Served:
    """A TorchThread served by a thread of its own while the test runs."""

    def __init__(self, torch_thread: TorchThread):
        self.torch_thread, self.stop = torch_thread, threading.Event()
        self.thread = threading.Thread(target=torch_thread.serve, args=(self.stop,), name="torch-test", daemon=True)

    def __enter__(self) -> int:
        self.thread.start()
        while not self.torch_thread.serving:
            threading.Event().wait(0.001)
        return self.thread.ident

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def in_thread(fn, *args):
    """``fn(*args)`` on a new thread (a gradio handler's); its result or its exception."""
    out = {}

    def body():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the call never returned"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_work_runs_on_the_serving_thread_and_comes_back():
    runner = TorchThread()
    assert in_thread(runner.call, threading.get_ident) != threading.get_ident()  # not serving: where asked
    with Served(runner) as server:
        assert in_thread(runner.call, threading.get_ident) == server
        assert runner.call(lambda a, b=0: a + b, 2, b=3) == 5
        with pytest.raises(KeyError, match="missing"):
            in_thread(runner.call, {}.__getitem__, "missing")  # the exception itself, in the caller
        # work handed over by the serving thread itself runs at once (no wait on itself)
        assert in_thread(runner.call, lambda: runner.call(threading.get_ident)) == server
    assert not runner.serving
    assert runner.call(threading.get_ident) == threading.get_ident()  # serving ended: where asked again


def test_a_stream_steps_on_the_serving_thread_and_returns_its_value():
    runner, where = TorchThread(), []

    def rounds():
        for i in range(3):
            where.append(threading.get_ident())
            yield i
        return "done"

    def consume():
        run = Returning(runner.stream(rounds()))
        return list(run), run.value

    with Served(runner) as server:
        assert in_thread(consume) == ([0, 1, 2], "done")
    assert where == [server] * 3
    where.clear()
    assert consume() == ([0, 1, 2], "done") and where == [threading.get_ident()] * 3  # not serving: here


def test_streams_holding_a_lock_across_rounds_run_one_after_the_other():
    """An engine stream holds the engine's lock between its rounds: two requests' streams must
    not interleave on the one thread (the second would wait for a lock only the first can free)."""
    runner, lock, log = TorchThread(), threading.Lock(), []

    def engine_stream(name):
        with lock:
            for i in range(5):
                log.append(name)
                yield i

    def consume(name):
        return sum(runner.stream(engine_stream(name)))

    with Served(runner):
        threads = [threading.Thread(target=consume, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "deadlock"
    assert sorted(log) == ["a"] * 5 + ["b"] * 5
    assert log in (["a"] * 5 + ["b"] * 5, ["b"] * 5 + ["a"] * 5)


def test_a_cancelled_stream_closes_its_generator_on_the_serving_thread():
    runner, lock, closed_on = TorchThread(), threading.Lock(), []

    def engine_stream():
        with lock:
            try:
                yield from range(100)
            finally:
                closed_on.append(threading.get_ident())

    def cancel_after_two():
        stream = runner.stream(engine_stream())
        next(stream), next(stream)
        stream.close()  # gradio closes the handler's generator when a request is cancelled

    with Served(runner) as server:
        in_thread(cancel_after_two)
        assert closed_on == [server] and not lock.locked()
        assert in_thread(lambda: sum(runner.stream(engine_stream()))) == sum(range(100))  # the next one runs


def test_a_forked_worker_runs_its_work_where_it_is_asked():
    """ZeroGPU runs the GPU function in a process forked from the app: the serving thread is
    not there, so the work must not wait for it."""
    runner = TorchThread()
    runner._owner = (os.getpid() + 1, threading.get_ident() + 1)  # claimed in another process
    assert not runner.serving
    assert in_thread(runner.call, threading.get_ident) != runner._owner[1]
    assert in_thread(lambda: list(runner.stream(iter(range(3))))) == [0, 1, 2]


def test_the_apps_request_runs_its_models_and_paints_on_the_serving_thread(monkeypatch):
    """A request made on a handler thread: every round, the painting and the scoring on the
    serving thread, and the same tokens as the engine run directly."""
    engine = engines.engine_for("toy")
    painted_on = []
    paint = views.Painter._paint
    monkeypatch.setattr(
        views.Painter, "_paint", lambda self, t: painted_on.append(threading.get_ident()) or paint(self, t)
    )
    stepped_on = []
    stream = engine.stream

    def spied_stream(*args, **kwargs):
        run = Returning(stream(*args, **kwargs))
        for rnd in run:
            stepped_on.append(threading.get_ident())
            yield rnd
        return run.value

    monkeypatch.setattr(engine, "stream", spied_stream)

    def request():
        handlers.RESULTS.entries.clear()
        return list(handlers.generate("red apple", 3, "toy", "none", tau=0.3))[-1]

    with Served(TORCH) as server:
        final = in_thread(request)
    assert stepped_on and set(stepped_on) == {server}
    assert painted_on and set(painted_on) == {server}
    state = final[-1]
    for label, method in (("AR", "ar"), ("MuLo-SD", "mulo")):
        direct = engines.engine_for("toy").generate("red apple", method, 3, {"tau": 0.3} if method == "mulo" else None)
        np.testing.assert_array_equal(state["views"][label].trace.tokens, direct.tokens.numpy())
