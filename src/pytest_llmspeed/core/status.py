"""What a cell is: valid, failed or error, and why. One rule, for the pytest layer and for
scripts that drive the core alike.

:func:`cell_status` is a pure function of what a cell's measurement gave (its result, or the
error that stopped it) and the limits. Its words are the core's: they name no command-line
option. ``setting`` names the setting that decided the status or may change it
(``"max_error_rate"``, ``"timeout"``, ``"prompt_form"``); the pytest layer turns it into the
option (``plugin/messages.py``), as it does for the core's errors.

The rule, first match wins:

- an error stopped the cell: ``failed`` when the server refused the request (HTTP 4xx/5xx at
  a length the arithmetic let through) or counted the prompt at another length; else ``error``;
- a decode window that ended early (``aborted``): ``error``;
- the server counted other prompt lengths than the cell's: ``failed``;
- more requests failed than ``max_error_rate`` allows: ``failed``;
- the server's generation counter disagrees with the tokens received
  (:func:`~.protocol.counter_disagreement`): ``failed``;
- else ``valid``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..results import Status
from .errors import LLMSpeedError, RequestRejected, WrongPromptLength
from .protocol import DecodeResult, PrefillResult, counter_disagreement

#: the share of a decode cell's requests that may fail before the cell does
MAX_ERROR_RATE = 0.05


@dataclass(frozen=True)
class CellStatus:
    """A cell's status, why, and the settings that bear on it."""

    status: Status
    reason: str | None = None  # why it is not valid, in the core's words
    setting: str | None = None  # the setting that decided it or may change it
    errors: str | None = None  # what the failed requests said: "3× HTTP 500: ...; 1× ..."
    errors_setting: str | None = None  # the setting that may fix those ("timeout")
    error: LLMSpeedError | None = field(default=None, compare=False, repr=False)  # the cause

    @property
    def valid(self) -> bool:
        return self.status is Status.VALID

    @property
    def message(self) -> str | None:
        """The reason and the failed requests' summary: a record's reason outside pytest."""
        if self.reason is None:
            return None
        return f"{self.reason}: {self.errors}" if self.errors else self.reason


VALID = CellStatus(Status.VALID)


def cell_status(
    outcome: DecodeResult | PrefillResult | LLMSpeedError,
    max_error_rate: float = MAX_ERROR_RATE,
) -> CellStatus:
    """The status of a prefill or decode cell from what its measurement gave: its result, or
    the error that stopped it (``Bench.prefill`` and ``Bench.decode`` raise
    :class:`~.errors.LLMSpeedError`)."""
    if isinstance(outcome, LLMSpeedError):
        return _stopped(outcome)
    if isinstance(outcome, PrefillResult):
        return VALID  # run_prefill raises for everything that is not
    return _decode_status(outcome, max_error_rate)


def _stopped(exc: LLMSpeedError) -> CellStatus:
    if isinstance(exc, RequestRejected):
        # The arithmetic says the cell fits: a refusal is the server's failure, not a skip (an
        # upgrade that stops serving 128K prompts must fail the gate).
        return CellStatus(
            Status.FAILED,
            f"the server refused a prompt that fits (HTTP {exc.status}: {exc.reason})",
            error=exc,
        )
    if isinstance(exc, WrongPromptLength):
        return CellStatus(Status.FAILED, exc.message, exc.setting, error=exc)
    return CellStatus(Status.ERROR, exc.message, exc.setting, error=exc)


def _decode_status(result: DecodeResult, max_error_rate: float) -> CellStatus:
    errors = "; ".join(f"{n}× {msg}" for msg, n in result.errors.items()) or None
    # the first of the settings that may fix the failed requests (the client knows "timeout")
    errors_setting = min(result.error_settings, default=None)

    def failed(status: Status, reason: str, setting: str | None = None) -> CellStatus:
        return CellStatus(status, reason, setting, errors, errors_setting)

    if result.aborted:
        return failed(Status.ERROR, result.aborted, result.aborted_setting)
    if result.wrong_lengths:
        return failed(
            Status.FAILED,
            f"the server counted other prompt lengths than {result.context} tokens: "
            + ", ".join(f"{k:,} ({v}×)" for k, v in sorted(result.wrong_lengths.items()))
            + "; the figures would be for other prompts",
            "prompt_form",
        )
    if result.error_rate > max_error_rate:
        failures = sum(result.errors.values())
        return failed(
            Status.FAILED,
            f"{failures} of {result.stats.requests} requests failed "
            f"({result.error_rate:.0%} > max_error_rate {max_error_rate:g})",
            "max_error_rate",
        )
    disagreement = counter_disagreement(result)
    if disagreement:
        return failed(Status.FAILED, disagreement)
    if result.recount is not None and result.recount.disagreement:
        return failed(Status.FAILED, result.recount.disagreement)
    return VALID
