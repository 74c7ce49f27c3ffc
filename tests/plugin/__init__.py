"""The plugin end to end (pytester and real pytest processes), and what those tests share."""

import signal


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a pytest process a test will interrupt: SIGINT handled as at a
    terminal. A shell starts background jobs with SIGINT ignored, and a Python started that way
    never raises KeyboardInterrupt: Ctrl-C tests would fail when CI itself runs in the
    background."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
