"""Secrets by type, and server strings made safe for a person (docs/trust.md).

Two rules, one module:

- A secret (the API key, and any key, token or password value read from ``--llm-serve``'s
  command) is a :class:`Secret`: its ``repr`` and ``str`` are ``<redacted>``, so no dataclass
  repr, traceback with locals (``-l``, ``--tb=long``) or JUnit failure text can show it. Its
  value is read only where it is sent (:meth:`Secret.reveal`). Every secret a run knows is
  registered (:func:`register`), and :func:`redact_known` removes all of them from a text
  before it is cut, stored or printed.
- A string a server sent (a model id, a version, an HTTP error body, an error event) reaches a
  person only through :func:`for_person`: control characters (ESC included) removed, newlines
  replaced, a leading ``::`` (a GitHub workflow command) broken, known secrets redacted, and
  the length capped. :func:`markdown_inline` does the same for the Markdown job summary and
  escapes Markdown and HTML too.
"""

from __future__ import annotations

import base64
import re
import unicodedata
from typing import Any

REDACTED = "<redacted>"

#: the most characters of one server string shown to a person
SHOWN_CHARS = 200


class Secret:
    """A secret value whose ``repr`` and ``str`` never show it.

    Compare, hash and pickle as the value (a worker process gets the key it sends); read it
    with :meth:`reveal`, only where it is sent."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = str(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return REDACTED

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Secret):
            return self._value == other._value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Secret, (self._value,))


def secret(value: str | Secret | None) -> Secret | None:
    """``value`` as a :class:`Secret` (registered), None when empty."""
    if value is None or value == "":
        return None
    s = value if isinstance(value, Secret) else Secret(value)
    if not s:
        return None
    register(s)
    return s


def reveal(value: str | Secret | None) -> str | None:
    """The plain value of a secret (or of a plain string), for the one place it is sent."""
    if isinstance(value, Secret):
        return value.reveal()
    return value


#: every secret this process knows: the API key, values read from --llm-serve's command
_KNOWN: set[str] = set()
#: shorter values are not redacted as substrings (they would eat ordinary words)
_MIN_SECRET = 4


def register(value: str | Secret | None) -> None:
    """Remember a secret, so that :func:`redact_known` removes it from every text: as it is,
    and as a server may echo it encoded (:func:`encoded_forms`)."""
    plain = reveal(value)
    if plain and len(plain) >= _MIN_SECRET:
        _KNOWN.add(plain)
        _KNOWN.update(encoded_forms(plain))


#: encoded forms shorter than this are not redacted (they could match ordinary text)
_MIN_FORM = 12


def encoded_forms(plain: str) -> set[str]:
    """How a server may echo a secret encoded: every byte percent-encoded (upper and lower
    hex), and base64 (standard and URL-safe) at each of the three alignments the secret can
    have in the encoded text, less the characters it shares with its neighbours. Only forms
    of :data:`_MIN_FORM` characters or more (a long secret's)."""
    raw = plain.encode()
    forms = {"".join(f"%{b:02X}" for b in raw), "".join(f"%{b:02x}" for b in raw)}
    for before in range(3):
        enc = base64.b64encode(b"\0" * before + raw).decode()
        start = 4 if before else 0  # the first group mixes the secret with what precedes it
        stop = len(enc) - (4 if (before + len(raw)) % 3 else 0)  # the last, with what follows
        inner = enc[start:stop]
        forms |= {inner, inner.replace("+", "-").replace("/", "_")}
    return {f for f in forms if len(f) >= _MIN_FORM and f != plain}


def known_secrets() -> frozenset[str]:
    """Every registered secret and its encoded forms (what :func:`redact_known` removes)."""
    return frozenset(_KNOWN)


def forget_all() -> None:
    """Forget every registered secret (tests)."""
    _KNOWN.clear()


def redact_known(text: str, *also: str | Secret | None) -> str:
    """``text`` with every registered secret (and ``also``) replaced by ``<redacted>``,
    longest first (a key that contains another is removed whole)."""
    values = set(_KNOWN)
    for extra in also:
        plain = reveal(extra)
        if plain:
            values.add(plain)
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


# -- server strings for a person -----------------------------------------------------------------

#: C0 and C1 control characters and DEL, except the whitespace handled apart
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\u2028\u2029\x85]")


def _printable(text: str) -> str:
    """Control and format characters removed (ESC sequences lose their ESC: what stays is
    plain text), tabs as spaces, line breaks as `` ⏎ ``."""
    text = _LINE_BREAKS.sub(" ⏎ ", text).replace("\t", " ")
    text = _CONTROL.sub("", text)
    if not text.isascii():
        # bidirectional overrides and other invisible format characters (Cf) can reorder or
        # hide what a terminal shows
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text


def for_person(value: object, limit: int = SHOWN_CHARS, *also: str | Secret | None) -> str:
    """A string from a server, made safe to show: secrets redacted first (before any cut),
    control characters removed, line breaks replaced, a leading ``::`` broken (so it can
    never start a GitHub workflow command), and at most ``limit`` characters (an ellipsis
    and the length cut say so)."""
    text = redact_known(str(value), *also)
    text = _printable(text)
    if len(text) > limit:
        text = f"{text[: max(limit - 1, 1)]}… (+{len(text) - limit + 1:,} chars)"
    stripped = text.lstrip()
    if stripped.startswith("::"):
        text = ": :" + stripped[2:]
    return text


def printable(text: str) -> str:
    """A text of the plugin's own that may hold server strings, made safe as a whole: control
    characters removed (its own line breaks kept), known secrets redacted, and no line that
    starts with ``::``. The last gate before the terminal and the CI log."""
    text = redact_known(text)
    if not text.isascii():  # bidirectional overrides, zero-width and other format characters
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
        text = _LINE_BREAKS.sub(lambda m: "\n" if m.group() in ("\n", "\r\n") else " ⏎ ", text)
    lines = []
    for line in text.split("\n"):
        line = _CONTROL.sub("", line.replace("\r", "").replace("\t", " "))
        if line.lstrip().startswith("::"):
            line = ": :" + line.lstrip()[2:]
        lines.append(line)
    return "\n".join(lines)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def markdown_inline(value: object, limit: int = SHOWN_CHARS) -> str:
    """A server string for the Markdown job summary: :func:`for_person`, then HTML's ``<``,
    ``>`` and ``&`` as entities and Markdown's punctuation escaped, so it can add no heading,
    table, link, image or raw HTML."""
    text = for_person(value, limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
