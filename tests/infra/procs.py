"""Child processes that tests signal."""

from __future__ import annotations

import signal


def default_signals() -> None:
    """``preexec_fn`` for a child that must act on SIGINT/SIGTERM: restore their default dispositions.

    A test runner started in the background (``cmd &``, many CI runners) has SIGINT ignored, an ignored
    disposition survives fork and exec, and ``subprocess`` restores only SIGPIPE/SIGXFSZ: without this
    the child would never see the signal a test sends it (a Python child then also gets its
    KeyboardInterrupt handler back, as Python installs it only over a default disposition)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
