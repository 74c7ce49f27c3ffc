"""The pytest layer's words for the core's errors: the core says what happened, this adds the
option that may fix it."""

from __future__ import annotations

from ..core.errors import LLMSpeedError, ServerUnreachable

#: the option (and what to do with it) for each setting a core error may name
HINTS = {
    "timeout": "(--llm-timeout)",
    "endpoint": "Check --llm-endpoint (the base URL, without /v1).",
    "api_key": "Set --llm-api-key or LLMSPEED_API_KEY to the server's key.",
    "model": "Fix --llm-model.",
    "prompt_form": "(--llm-prompt-form=ids)",
    "api": "(--llm-api=completions)",
    "max_model_len": "Give --llm-max-model-len=TOKENS, or drop max from --llm-contexts.",
    "serve_timeout": "(--llm-serve-timeout)",
}


def with_hint(message: str, setting: str | None) -> str:
    """``message`` with the option for ``setting`` added (parenthesised hints inside the
    sentence, imperative ones after it)."""
    hint = HINTS.get(setting or "")
    if not hint:
        return message
    if hint.startswith("("):
        return f"{message} {hint}"
    return f"{message.rstrip('.')}. {hint}"


def describe(exc: LLMSpeedError) -> str:
    """One line for the user: the core's message and the option to check."""
    if isinstance(exc, ServerUnreachable):
        text = exc.message
        if exc.setting == "timeout":
            text += " (--llm-timeout)"
        return f"{text}. Check --llm-endpoint and that the server is running."
    return with_hint(exc.message, exc.setting)
