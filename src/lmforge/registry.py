"""Name → implementation registries used by recipes (models, objectives, tasks, adapters, evals)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from lmforge.errors import LMForgeError
from lmforge.flag_hints import suggest

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from recipe names to classes or factories; an unknown name is one line that suggests the names
    meant (`flag_hints.suggest`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            # The names it starts or is part of first (gpt2 → gpt2-124m, ...), else difflib's closest, as the
            # CLI's flags suggest them; nothing close: every name.
            tip = suggest(name, self._items) or f" (known: {', '.join(sorted(self._items))})"
            raise LMForgeError(f"unknown {self.kind} '{name}'{tip}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


MODELS: Registry = Registry("model preset")
OBJECTIVES: Registry = Registry("objective")
TASKS: Registry = Registry("task")
ADAPTERS: Registry = Registry("adapter")
EVALS: Registry = Registry("eval")
