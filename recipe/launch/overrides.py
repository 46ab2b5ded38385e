"""Hydra override lists with each key once (pure stdlib).

A launch assembles overrides from several sources (launcher, demo, environment, command line);
``OverrideList`` keeps one entry per key, in first-seen order, the last source winning, and
records every replacement so the launcher can print it (no override wins silently).

    >>> o = OverrideList()
    >>> _ = o.add(["trainer.total_training_steps=4", "+platform=cpu"], source="demo")
    >>> _ = o.add(["trainer.total_training_steps=9"], source="command line")
    >>> o.as_list()
    ['+platform=cpu', 'trainer.total_training_steps=9']
    >>> o.replaced
    [('trainer.total_training_steps', '4', 'demo', '9', 'command line')]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Override:
    """One hydra override ``[prefix]key[=value]``; prefix ``+``, ``++`` or ``~``."""

    prefix: str
    key: str
    value: str | None

    @classmethod
    def parse(cls, text: str) -> "Override":
        prefix = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
        body = text[len(prefix):]
        key, sep, value = body.partition("=")
        if not key or (not sep and prefix != "~"):
            raise ValueError(f"not a hydra override (key=value): {text!r}")
        return cls(prefix=prefix, key=key.strip(), value=value if sep else None)

    @property
    def is_group(self) -> bool:
        """A config-group selection (``+model=qwen3_1p7b``): a defaults-list entry, not a value."""
        return self.key.split("@")[0] in GROUPS

    def __str__(self) -> str:
        return f"{self.prefix}{self.key}" + ("" if self.value is None else f"={self.value}")


# Config groups of the project's configs (recipe/*/config/<group>/, recipe/cpu/config/platform).
GROUPS = ("model", "experiment", "demo", "platform")


class OverrideList:
    """Overrides keyed by their key; a later ``add`` of the same key replaces the value in place."""

    def __init__(self):
        self._items: dict[str, tuple[Override, str]] = {}
        self.replaced: list[tuple[str, str | None, str, str | None, str]] = []

    def add(self, texts: Iterable[str], *, source: str) -> "OverrideList":
        for text in texts:
            item = Override.parse(text)
            previous = self._items.get(item.key)
            if previous is not None and previous[0].value != item.value:
                self.replaced.append((item.key, previous[0].value, previous[1], item.value, source))
            self._items[item.key] = (item, source)
        return self

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        return None if item is None else item[0].value

    def source(self, key: str) -> str | None:
        item = self._items.get(key)
        return None if item is None else item[1]

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def as_list(self) -> list[str]:
        """Group selections first (their order is the defaults-list order), then values."""
        items = [item for item, _ in self._items.values()]
        return [str(i) for i in items if i.is_group] + [str(i) for i in items if not i.is_group]
