"""The one progress type every layer uses: a callable that takes one line of progress (or None for quiet).

The CLI passes its progress display (stderr, with the time spent and left); services and adapters call
:func:`say` and never print."""

from __future__ import annotations

from typing import Callable

Progress = Callable[[str], None] | None


def say(progress: Progress, message: str) -> None:
    """Report ``message`` when someone is listening."""
    if progress:
        progress(message)
