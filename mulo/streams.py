"""Generators that yield progress and *return* a result (``Engine.stream``, the methods,
``views.stream_view``): one way to drive them, so no caller writes the ``StopIteration`` loop."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")
Value = TypeVar("Value")


class Returning(Generic[Item, Value]):
    """Iterate a generator's items, then read what it returned from ``.value``::

    run = Returning(engine.stream(prompt))
    for rnd in run:
        ...
    result = run.value
    """

    def __init__(self, generator: Generator[Item, None, Value]):
        self.generator = generator
        self.done = False
        self._value: Value | None = None

    def __iter__(self) -> Iterator[Item]:
        self._value = yield from self.generator
        self.done = True

    @property
    def value(self) -> Value:
        if not self.done:
            raise RuntimeError("the generator has not finished: iterate it to the end first")
        return self._value


def drain(generator: Generator[Item, None, Value]) -> Value:
    """Run a generator to its end, dropping its items; return what it returned."""
    run = Returning(generator)
    for _ in run:
        pass
    return run.value
