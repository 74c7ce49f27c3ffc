"""The simulator's own deterministic tokenizer (no download, same answer on every machine).

Vocabulary (``vocab_size`` ids, generated, fixed):

- 0..15: special tokens (0 ``<|endoftext|>`` is EOS, 1 ``<|im_start|>``, 2 ``<|im_end|>``,
  3 ``<think>``, 4 ``</think>``, 5..15 reserved);
- 16..271: the 256 byte tokens ``<0x00>`` .. ``<0xFF>`` (byte-level fallback);
- then whitespace, ASCII characters, common words and generated syllable words, each with and
  without a leading space.

Text is split by :data:`PIECE_RE` (an optional leading space + up to 12 ASCII letters, or one
digit, or one other ASCII character; each non-ASCII character alone; runs of whitespace). A
non-ASCII character is its UTF-8 byte tokens (byte-level fallback, as the output text's byte
pairs are generated: so output text tokenizes back to the tokens it was generated as). A piece
in the vocabulary gets its id; any other piece gets a stable hash id (crc32) among the word ids,
so tokenizing never fails and never depends on the process. Counting is what matters here:
``/tokenize``, ``usage.prompt_tokens`` and token-id prompts agree exactly. ``detokenize`` maps
ids back to text (hashed pieces do not round-trip).

Chat template (``apply_chat_template``): each message is
``<|im_start|> ROLE \\n CONTENT <|im_end|> \\n`` = content tokens + 5, and the generation prompt
``<|im_start|> assistant \\n`` adds 3: a chat prompt has sum(content tokens + 5) + 3 tokens.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

EOS_ID = 0
IM_START_ID = 1
IM_END_ID = 2
THINK_ID = 3
END_THINK_ID = 4
NUM_SPECIAL = 16
BYTE_BASE = NUM_SPECIAL
FIRST_PIECE_ID = BYTE_BASE + 256
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_GENERATION_PROMPT_TOKENS = 3

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"] + [
    f"<|reserved_{i}|>" for i in range(5, NUM_SPECIAL)
]

PIECE_RE = re.compile(
    r" ?[A-Za-z]{1,12}| ?\d| ?_|[^\x00-\x7f]| ?[^\s\w\x80-\U0010ffff]|\s+(?!\S)|\s+"
)

_COMMON_TEXT = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new "
    "work part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form sentence great think say help low "
    "line differ turn cause much mean before move right boy old too same tell does set three "
    "want air well also play small end put home read hand port large spell add even land here "
    "must big high such follow act why ask men change went light kind off need house picture "
    "try us again animal point mother world near build self earth father head stand own page "
    "should country found answer school grow study still learn plant cover food sun four "
    "between state keep eye never last let thought city tree cross farm hard start might story "
    "saw far sea draw left late run while press close night real life few north open seem "
    "together next white children begin got walk example ease paper group always music those "
    "both mark often letter until mile river car feet care second book carry took science eat "
    "room friend began idea fish mountain stop once base hear horse cut sure watch color face "
    "wood main enough plain girl usual young ready above ever red list though feel talk bird "
    "soon body dog family direct pose leave song measure door product black short numeral class "
    "wind question happen complete ship area half rock order fire south problem piece told knew "
    "pass since top whole king space heard best hour better true during hundred five remember "
    "step early hold west ground interest reach fast verb sing listen six table travel less "
    "morning ten simple several vowel toward war lay against pattern slow center love person "
    "money serve appear road map rain rule govern pull cold notice voice unit power town fine "
    "certain fly fall lead cry dark machine note wait plan figure star box noun field rest "
    "correct able pound done beauty drive stood contain front teach week final gave green oh "
    "quick develop ocean warm free minute strong special mind behind clear tail produce fact "
    "street inch multiply nothing course stay wheel full force blue object decide surface deep "
    "moon island foot system busy test record boat common gold possible plane stead dry wonder "
    "laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes "
    "distant fill east paint language among grand ball yet wave drop heart am present heavy "
    "dance engine position arm wide sail material size vary settle speak weight general ice "
    "matter circle pair include divide syllable felt perhaps pick sudden count square reason "
    "length represent art subject region energy hunt probable bed brother egg ride cell believe "
    "fraction forest sit race window store summer train sleep prove lone leg exercise wall "
    "catch mount wish sky board joy winter sat written wild instrument kept glass grass cow job "
    "edge sign visit past soft fun bright gas weather month million bear finish happy hope "
    "flower clothe strange gone jump baby eight village meet root buy raise solve metal whether "
    "push seven paragraph third shall held hair describe cook floor either result burn hill "
    "safe cat century consider type law bit coast copy phrase silent tall sand soil roll "
    "temperature finger industry value fight lie beat excite natural view sense capital token "
    "prompt decode prefill batch stream cache kernel tensor matrix vector scalar alpha beta "
    "gamma delta epsilon zeta theta kappa lambda sigma omega valley harbor bridge tower garden "
    "desert amber silver golden calm rapid"
)
_COMMON = tuple(_COMMON_TEXT.split())

_ONSETS_TEXT = "b c d f g h j k l m n p r s t v w z br cr dr fr gr pr tr st sl sp"
_ONSETS = tuple(_ONSETS_TEXT.split())
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ["", "n", "r", "s", "l", "t", "m", "nd", "st"]


def _base_pieces() -> list[str]:
    pieces: list[str] = [" ", "  ", "   ", "    ", "\n", "\n\n", "\t", " \n", "\n\n\n"]
    for code in range(33, 127):
        ch = chr(code)
        pieces.append(ch)
        pieces.append(" " + ch)
    for word in _COMMON:
        for w in (word, word.capitalize()):
            pieces.append(" " + w)
            pieces.append(w)
    return pieces


@lru_cache(maxsize=8)
def build_vocab(vocab_size: int) -> tuple[str, ...]:
    """The generated vocabulary: ``vocab_size`` distinct token strings."""
    pieces = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    seen: set[str] = set(pieces)

    def add(piece: str) -> bool:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
        return len(pieces) >= vocab_size

    for piece in _base_pieces():
        if add(piece):
            return tuple(pieces)
    syllables = [o + n + c for o in _ONSETS for n in _NUCLEI for c in _CODAS]
    for a in syllables:
        if add(" " + a) or add(a):
            return tuple(pieces)
    for a in syllables:
        for b in syllables:
            if add(" " + a + b) or add(a + b):
                return tuple(pieces)
    raise ValueError(f"vocab_size {vocab_size} is larger than the generator makes")


class Tokenizer:
    """Deterministic word-piece tokenizer over a generated vocabulary."""

    def __init__(self, vocab_size: int = 32000) -> None:
        if vocab_size < 4096:
            raise ValueError("vocab_size must be at least 4096")
        self.vocab_size = vocab_size
        self.vocab = build_vocab(vocab_size)
        self._ids = {piece: i for i, piece in enumerate(self.vocab) if i >= FIRST_PIECE_ID}
        self._role_ids = {role: self._piece_id(role) for role in ("system", "user", "assistant")}
        self._newline = self._ids["\n"]
        self._bytes = [self._token_bytes(i) for i in range(vocab_size)]
        # Output-token tables: words with a leading space, a few punctuation marks.
        self.word_ids = [
            i for i, p in enumerate(self.vocab) if p.startswith(" ") and p[1:].isalpha()
        ]

    def _piece_id(self, piece: str) -> int:
        found = self._ids.get(piece)
        if found is not None:
            return found
        span = self.vocab_size - FIRST_PIECE_ID
        return FIRST_PIECE_ID + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % span

    def _token_bytes(self, token_id: int) -> bytes:
        if BYTE_BASE <= token_id < FIRST_PIECE_ID:
            return bytes([token_id - BYTE_BASE])
        return self.vocab[token_id].encode("utf-8")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        piece_id = self._piece_id
        if text.isascii():
            return [piece_id(p) for p in PIECE_RE.findall(text)]
        ids: list[int] = []
        for p in PIECE_RE.findall(text):
            if len(p) == 1 and not p.isascii():  # byte-level fallback: its UTF-8 bytes
                ids.extend(BYTE_BASE + b for b in p.encode("utf-8", "surrogatepass"))
            else:
                ids.append(piece_id(p))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; byte tokens are joined before UTF-8 decoding."""
        table = self._bytes
        return b"".join(table[i] for i in ids).decode("utf-8", "replace")

    def token_str(self, token_id: int) -> str:
        """The vocabulary string of one id."""
        return self.vocab[token_id]

    def out_of_vocab(self, ids: Sequence[int]) -> int | None:
        """The first id outside the vocabulary, if any."""
        if not ids:
            return None
        size = self.vocab_size
        if min(ids) >= 0 and max(ids) < size:  # C-speed check of the common case
            return None
        for i in ids:
            if not 0 <= i < size:
                return i
        return None

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Prompt ids of a chat: content + 5 per message, + 3 for the generation prompt."""
        ids: list[int] = []
        for message in messages:
            role = str(message.get("role", "user"))
            ids.append(IM_START_ID)
            ids.append(self._role_ids.get(role) or self._piece_id(role))
            ids.append(self._newline)
            ids.extend(self.encode(message_text(message.get("content"))))
            ids.append(IM_END_ID)
            ids.append(self._newline)
        if add_generation_prompt:
            ids.extend((IM_START_ID, self._role_ids["assistant"], self._newline))
        return ids


def message_text(content: Any) -> str:
    """Text of a chat message's content: a string or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError("only text content parts are supported")
        return "\n".join(parts)
    raise ValueError("message content must be a string or a list of text parts")
