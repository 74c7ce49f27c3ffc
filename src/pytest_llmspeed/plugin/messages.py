"""The pytest layer's words for the core's errors and cells' statuses: the core says what
happened and names the setting, this adds the option that may fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import LLMSpeedError, ServerUnreachable
from ..results import Status

if TYPE_CHECKING:
    from ..core.status import CellStatus

#: the option (and what to do with it) for each setting a core error may name
HINTS = {
    "timeout": "(--llm-timeout)",
    "endpoint": "Check --llm-endpoint (the base URL, without /v1).",
    "api_key": "Set --llm-api-key or LLMSPEED_API_KEY to the server's key.",
    "model": "Fix --llm-model.",
    "prompt_form": "(--llm-prompt-form=ids)",
    "api": "(--llm-api=completions)",
    "max_model_len": "Give --llm-max-model-len=TOKENS, or drop max and limit from the contexts.",
    "serve_timeout": "(--llm-serve-timeout)",
}

#: the option of each setting that a core message names in its words ("> max_error_rate 0.05")
OPTIONS = {"max_error_rate": "--llm-max-error-rate"}


def with_hint(message: str, setting: str | None) -> str:
    """``message`` with the option for ``setting`` added (parenthesised hints inside the
    sentence, imperative ones after it)."""
    hint = HINTS.get(setting or "")
    if not hint:
        return message
    if hint.startswith("("):
        return f"{message} {hint}"
    return f"{message.rstrip('.')}. {hint}"


def arm_option(arm: str, launched: bool) -> str:
    """The option that gave an A/B's ``arm`` ("old", "new") its server: the command the
    plugin launches (``launched``) or the endpoint it was given."""
    if arm == "old":
        return "--llm-serve-baseline" if launched else "--llm-endpoint-baseline"
    return "--llm-serve" if launched else "--llm-endpoint"


def describe(exc: LLMSpeedError, endpoint: str = "--llm-endpoint") -> str:
    """One line for the user: the core's message and the option to check (``endpoint``: the
    option that gave the server's address, an A/B's old version's
    ``--llm-endpoint-baseline``)."""
    if isinstance(exc, ServerUnreachable):
        text = exc.message
        if exc.setting == "timeout":
            text += " (--llm-timeout)"
        return f"{text}. Check {endpoint} and that the server is running."
    if exc.setting == "endpoint" and endpoint != "--llm-endpoint":
        return f"{exc.message.rstrip('.')}. Check {endpoint} (the base URL, without /v1)."
    return with_hint(exc.message, exc.setting)


def cell_words(status: CellStatus) -> str:
    """Why a cell is not valid, for the user: the core's reason with the option of the setting
    that decided it (or may change it), and the failed requests' summary with theirs."""
    if status.error is not None and status.status is Status.ERROR:
        return describe(status.error)  # an error that stopped the cell, told as any other
    text = status.reason or ""
    option = OPTIONS.get(status.setting or "")
    if option and status.setting:
        text = text.replace(status.setting, option)
    else:
        text = with_hint(text, status.setting)
    if status.errors:
        text += ": " + with_hint(status.errors, status.errors_setting)
    return text
