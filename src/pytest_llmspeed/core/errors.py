"""The measurement core's errors: typed, with messages meant for the user as they are.

A core message says what happened in the server's and the protocol's words; it names no
command-line option. Where a setting is the likely fix, ``setting`` names it (``"timeout"``,
``"endpoint"``, ``"api_key"``, ``"model"``, ``"prompt_form"``) and the pytest layer adds the
option (``--llm-timeout``) to what it prints.
"""

from __future__ import annotations

import re

from .text import Secret, redact_known


class LLMSpeedError(Exception):
    """An error whose message is meant for the user as it is (no traceback)."""

    setting: str | None = None

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        if setting is not None:
            self.setting = setting

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class CellCut(Exception):
    """A cell stopped from outside before its end (a time limit the caller set on the run, see
    ``Bench.deadline``): its streams were cancelled and closed. Not the server's fault, so not an
    LLMSpeedError; the message says what cut it (``cut after 10 s by pytest-timeout``)."""


class ServerUnreachable(LLMSpeedError):
    """No connection, or no answer within the timeout."""

    setting = "endpoint"


class KeyRejected(LLMSpeedError):
    """The server refused the API key (HTTP 401/403)."""

    setting = "api_key"


class ModelNotFound(LLMSpeedError):
    """The server does not serve the model asked for, or serves none."""

    setting = "model"


class NotAnOpenAIServer(LLMSpeedError):
    """The endpoint does not answer like an OpenAI-compatible server."""

    setting = "endpoint"


class RequestRejected(LLMSpeedError):
    """The server answered a request with an HTTP error (4xx/5xx)."""

    def __init__(
        self, status: int, message: str, url: str | None = None, purpose: str | None = None
    ):
        text = f"HTTP {status}: {message}"
        if url and purpose:  # say which request, and what it was for
            text = f"{url} ({purpose}) answered {text}"
        super().__init__(text)
        self.status = status
        self.reason = message
        self.url = url


class MalformedAnswer(LLMSpeedError):
    """What the server sent breaks the protocol: a field of the wrong type or out of range, an
    answer that is not the JSON it should be (docs/trust.md). The message names the route, the
    field and the value (cut short)."""

    setting = "endpoint"

    def __init__(self, route: str, what: str, field: str | None = None):
        where = f"{route}: {field} {what}" if field else f"{route}: {what}"
        super().__init__(where)
        self.route, self.field, self.what = route, field, what


class AnswerTooLarge(MalformedAnswer):
    """An answer, a line of a stream or a header over its cap (docs/trust.md)."""


class Redirected(LLMSpeedError):
    """The server answered with a redirect, which is never followed."""

    setting = "endpoint"


class WrongPromptLength(LLMSpeedError):
    """The server counted a prompt at another length than it was built to be."""

    setting = "prompt_form"


def redact(text: str, secret: str | Secret | None) -> str:
    """Remove a secret, and every secret the run registered, from a text (API keys never
    appear in any output)."""
    return redact_known(text, secret)


_SECRET_PATTERNS = (
    # --api-key VALUE, --api-key=VALUE, --hf-token 'VALUE' (any option naming a key/token/secret)
    re.compile(
        r"""(?P<keep>--(?:\w+[-_])*(?:api[-_]?key|key|token|secret|password)(?:=|\s+))"""
        r"""(?P<secret>"[^"]*"|'[^']*'|\S+)""",
        re.IGNORECASE,
    ),
    # Authorization: Bearer VALUE
    re.compile(r"(?P<keep>\bBearer\s+)(?P<secret>[^\s'\"]+)", re.IGNORECASE),
    # OPENAI_API_KEY=VALUE, HF_TOKEN=VALUE, export X_SECRET="VALUE"
    re.compile(
        r"""(?P<keep>\b[A-Z0-9_]*(?:_KEY|_TOKEN|_SECRET|_PASSWORD)=)"""
        r"""(?P<secret>"[^"]*"|'[^']*'|\S+)"""
    ),
)


def redact_secrets(text: str) -> str:
    """A command line or text with its secrets replaced by ``<redacted>``: the values of
    ``--api-key`` (and other key, token, secret or password options), bearer tokens, and
    ``*_KEY=`` / ``*_TOKEN=`` / ``*_SECRET=`` / ``*_PASSWORD=`` assignments."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + "<redacted>", text)
    return text


def secret_values(text: str) -> list[str]:
    """The secret values :func:`redact_secrets` would remove from ``text`` (quotes around a
    value dropped), to be registered: a server may echo them bare, where no pattern knows
    them."""
    found = []
    for pattern in _SECRET_PATTERNS:
        for m in pattern.finditer(text):
            value = m.group("secret")
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            if value:
                found.append(value)
    return found
