"""The engine model: continuous batching in steps, chunked prefill, block prefix cache, MTP.

:class:`EngineCore` knows nothing of time sources or HTTP: the caller asks it to ``plan`` a step
at time ``now``, waits the step's ``duration`` (real seconds in the server, virtual ones in
``benchmarks/reference_fit.py``) and calls ``complete`` to get each request's new tokens.

Draft acceptance: each request walks a golden-ratio sequence u = frac(u0 + n * 0.618...) from a
seeded u0, and a step accepts k drafts where u falls below the first k survival probabilities.
So any few dozen steps of a stream hold the profile's mix of 1..1+k token steps (low variance,
as real acceptance is over a long answer); ``--noise`` is the knob for randomness. With
``acceptance="text"`` (``--accept text``) each request's acceptance follows how predictable its
prompt is instead of the profile (:func:`predictability`, :func:`text_acceptance`), as n-gram
(prompt lookup) drafts accept more on text that repeats itself.

Admission reserves a request's whole KV footprint (prompt + max_tokens, in blocks, minus prompt
blocks already cached), so a running request never needs preempting; a request that does not
fit waits in FIFO order. Full prompt blocks are cached once computed, keyed by their tokens and
their predecessor's hash; unreferenced cached blocks are evicted least recently used first.

With ``preempt=True`` blocks are allocated as vLLM v1 allocates them: a request holds the blocks
of the tokens computed so far (plus its drafts' slots), so when the running contexts outgrow the
cache the newest running request is preempted: its blocks are freed, it goes back to the head of
the waiting queue, and once readmitted its prompt and generated tokens are computed again.

Counters follow vLLM 0.32's meaning (``vllm/v1/metrics/loggers.py``, ``stats.py``): the
step-tokens histogram observes, per step that produced output, the tokens generated plus the
computed (not cached) prompt tokens of requests whose first token came in that step; queue,
prefill and decode times are observed when a request finishes (first scheduled − reached the
scheduler, first token − first scheduled, last token − first token).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from .profiles import Profile

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
GOLDEN = 0.6180339887498949

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

#: vLLM's ``ITERATION_TOKENS_BUCKETS`` (vllm/v1/metrics/buckets.py)
ITERATION_TOKENS_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
#: vLLM's ``REQUEST_LATENCY_BUCKETS``: queue, prefill and decode time per request
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, ``+Inf`` last."""
        out, acc = [], 0
        for bound, n in zip((*map(repr, self.buckets), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out


@dataclass
class EngineStats:
    """Counters and histograms behind ``/metrics``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    #: decode steps by drafts accepted (index k: k accepted), behind ``spec_accepted_per_pos``
    spec_kept: list[int] = field(default_factory=list)
    #: prompt tokens of requests that got their first token, computed / found in the cache
    prompt_computed: int = 0
    prompt_cached: int = 0
    preemptions: int = 0
    #: simulated seconds of the steps completed (after speed and noise): the model's own clock
    step_seconds: float = 0.0
    #: bytes the completed steps read (the weights, the KV cache they attended over)
    read_bytes: float = 0.0
    finished: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))

    @property
    def spec_accepted_per_pos(self) -> list[int]:
        """Accepted drafts by position (0 = the first draft), as vLLM's ``..._per_pos``: a
        step that accepted k drafts accepted one at each position below k."""
        kept = self.spec_kept
        return [sum(kept[pos + 1 :]) for pos in range(max(len(kept) - 1, 0))]


class OutputSink(Protocol):
    """Receives a request's tokens as steps complete (the HTTP stream, or a test harness)."""

    def emit(self, req: SimRequest, n_new: int, finish: str | None, now: float) -> None: ...


_ids = itertools.count(1)


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine."""

    prompt_ids: Sequence[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    fault: str | None = None
    fault_at: int = 0
    stall_s: float = 0.0
    sink: OutputSink | None = None
    tag: Any = None
    seq: int = field(default_factory=lambda: next(_ids))
    # state
    state: str = WAITING
    arrival: float = 0.0
    ready_at: float = 0.0
    block_hashes: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    computed: int = 0
    output: int = 0
    stop_at: int = 0
    ref_hashes: list[int] = field(default_factory=list)
    next_block: int = 0
    anon_blocks: int = 0
    paused_until: float = 0.0
    spec_u: float = 0.0
    #: the drafts' survival probabilities when they are the request's own (``--accept text``)
    survival: tuple[float, ...] | None = None
    #: tokens to compute before the next token: the prompt, or after a preemption the prompt
    #: and the tokens generated before it
    prefill_target: int = 0
    preemptions: int = 0
    #: engine time of the first admission (vLLM's first SCHEDULED event)
    scheduled_at: float | None = None
    first_token_time: float | None = None
    last_token_time: float = 0.0
    finish_reason: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def __lt__(self, other: SimRequest) -> bool:
        return self.seq < other.seq


@dataclass
class StepPlan:
    """What one step runs: decoding requests, prefill chunks ``(request, tokens)``, duration."""

    decode: list[SimRequest]
    prefill: list[tuple[SimRequest, int]]
    duration: float
    #: bytes the step reads: the weights once, the KV cache of every context it attends over
    read_bytes: float = 0.0


class BlockPool:
    """KV blocks: anonymous (owned by one request) or cached (keyed by hash, ref-counted)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.cached: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.anon = 0

    @property
    def free(self) -> int:
        return self.num_blocks - self.anon - len(self.cached)

    @property
    def used(self) -> int:
        return self.anon + len(self.cached) - len(self.lru)

    def hit_blocks(self, hashes: Sequence[int], limit: int) -> int:
        """Length of the longest cached prefix of ``hashes``, at most ``limit`` blocks."""
        cached = self.cached
        n = 0
        for h in itertools.islice(hashes, limit):
            if h not in cached:
                break
            n += 1
        return n

    def can_allocate(self, hashes: Sequence[int], hits: int, need: int) -> bool:
        lru = self.lru
        reclaim = sum(1 for h in hashes[:hits] if h in lru)
        return self.free + len(lru) - reclaim >= need

    def allocate(self, hashes: Sequence[int], hits: int, need: int) -> None:
        cached, lru = self.cached, self.lru
        for h in hashes[:hits]:
            rc = cached[h]
            if rc == 0:
                del lru[h]
            cached[h] = rc + 1
        for _ in range(need - self.free):
            h, _ = lru.popitem(last=False)
            del cached[h]
        self.anon += need

    def register(self, h: int) -> bool:
        """Turn one anonymous block into cached block ``h``; False if ``h`` is cached already."""
        if h in self.cached:
            return False
        self.cached[h] = 1
        self.anon -= 1
        return True

    def release(self, hashes: Sequence[int], anon: int) -> None:
        """Drop a request's references; tail blocks become the first to be evicted."""
        cached, lru = self.cached, self.lru
        for h in reversed(hashes):
            rc = cached[h] - 1
            cached[h] = rc
            if rc == 0:
                lru[h] = None
        self.anon -= anon


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """Hash of every full block, each chained to its predecessor's."""
    out: list[int] = []
    h = 0
    ids_t = tuple(ids)
    for start in range(0, len(ids_t) - block_size + 1, block_size):
        h = hash((h, ids_t[start : start + block_size]))
        out.append(h)
    return out


#: what ``slower`` can slow, each a part of the step-time model: a step's base and decode
#: cost, its prefill chunks, the front end's delay before a request is scheduled
SLOWER_PARTS = ("decode", "prefill", "frontend")


def parse_slower(text: str | None) -> dict[str, float]:
    """``decode:0.1`` or ``decode:0.05,prefill:0.1`` → {part: fraction}: a second version of
    the same server with one factor slower (its times × 1 + fraction; a negative fraction is
    faster), every draw (noise, start factor, drift) the same. Raises ValueError in words."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        part, sep, value = item.partition(":")
        part = part.strip()
        if part not in SLOWER_PARTS or not sep:
            raise ValueError(
                f"slower {item.strip()!r}: expected PART:FRACTION with PART one of "
                f"{', '.join(SLOWER_PARTS)}, e.g. decode:0.1 (10 % slower decode steps)"
            )
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(f"slower {item.strip()!r}: {value!r} is not a number") from None
        if not -0.9 <= fraction <= 10 or part in out:
            raise ValueError(f"slower {item.strip()!r}: a fraction in -0.9 … 10, each part once")
        out[part] = fraction
    return out


@lru_cache(maxsize=64)
def _drift_knot(seed: int, k: int) -> float:
    return float(np.random.default_rng([seed, k]).uniform(-1.0, 1.0))


@dataclass(frozen=True)
class Drift:
    """The server's speed wandering over minutes, as a machine's does (thermals, a neighbour,
    the page cache): a factor of the wall clock and the seed only, so every start of every
    simulator with the same seed sees the same factor at the same moment (drift is shared by
    the starts within that time; start noise is not). ``factor(t) = 1 + amplitude · w(t /
    period_s)``, w a smooth curve through values drawn uniform in [-1, 1] at each whole period
    (cosine-interpolated): within ±amplitude, about one swing per period."""

    amplitude: float
    period_s: float = 300.0
    seed: int = 0

    def factor(self, t: float | None = None) -> float:
        x = (time.time() if t is None else t) / self.period_s
        k = math.floor(x)
        a, b = _drift_knot(self.seed, k), _drift_knot(self.seed, k + 1)
        w = a + (b - a) * (1 - math.cos(math.pi * (x - k))) / 2
        return 1.0 + self.amplitude * w


def start_factor(noise: float, seed: int | None = None) -> float:
    """The speed factor of one start of a server: ``exp(F·z − F²/2)``, z standard normal (mean
    1), drawn from ``numpy.random.default_rng(seed)`` — fresh OS entropy when ``seed`` is None,
    so two starts differ as a real server's do. Exactly 1 when ``noise`` is 0."""
    if noise == 0:
        return 1.0
    z = float(np.random.default_rng(seed).standard_normal())
    return math.exp(noise * z - noise * noise / 2)


#: the prompt's last tokens whose trigrams :func:`predictability` looks up
PREDICTABILITY_WINDOW = 2048
#: the per-draft acceptance of a prompt none of whose trigrams repeat, and of one all of whose do
TEXT_ACCEPT_MIN, TEXT_ACCEPT_MAX = 0.01, 0.9


def predictability(ids: Sequence[int], window: int = PREDICTABILITY_WINDOW) -> float:
    """The share of the trigrams ending in the prompt's last ``window`` tokens that appeared
    earlier in the prompt: 0 for text that never repeats three tokens, near 1 for a paragraph
    repeated. One sort of the prompt's trigrams (numpy): about 20 ms for 256K tokens."""
    if len(ids) < 4:
        return 0.0
    a = np.asarray(ids, dtype=np.int64) & 0x1FFFFF  # 21 bits each: one int64 per trigram
    grams = (a[:-2] << 42) | (a[1:-1] << 21) | a[2:]
    _, first, where = np.unique(grams, return_index=True, return_inverse=True)
    start = max(1, grams.size - window)
    seen = first[where[start:]] < np.arange(start, grams.size)
    return float(seen.mean())


def text_acceptance(share: float) -> float:
    """The per-draft conditional acceptance of a prompt of :func:`predictability` ``share``:
    linear from :data:`TEXT_ACCEPT_MIN` to :data:`TEXT_ACCEPT_MAX`."""
    return TEXT_ACCEPT_MIN + (TEXT_ACCEPT_MAX - TEXT_ACCEPT_MIN) * share


def conditional_acceptance(rate: float, drafts: int) -> float:
    """The per-draft acceptance ``a`` (draft i accepted with probability ``a`` when the drafts
    before it were) that makes ``accepted / draft tokens = (a + a² + … + a^drafts) / drafts``
    equal ``rate``."""
    if not 0 <= rate <= 1:
        raise ValueError(f"acceptance rate must be in [0, 1], got {rate}")
    if drafts <= 0 or rate in (0.0, 1.0):
        return rate
    lo, hi = 0.0, 1.0
    for _ in range(100):
        a = (lo + hi) / 2
        if sum(a**i for i in range(1, drafts + 1)) / drafts < rate:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


class EngineCore:
    """Scheduler + step-time model + KV cache of one simulated vLLM engine.

    ``max_num_seqs`` (None: the profile's) caps the running requests; ``acceptance`` (None: the
    profile's ``draft_acceptance``) sets the drafts' acceptance rate, accepted / draft tokens, or
    with ``"text"`` each request's from its prompt's :func:`predictability`;
    ``preempt`` allocates KV blocks as vLLM does, preempting under pressure (see the module).
    """

    def __init__(
        self,
        profile: Profile,
        *,
        kv_capacity: int | None = None,
        speed: float = 1.0,
        noise: float = 0.0,
        seed: int = 0,
        max_num_seqs: int | None = None,
        acceptance: float | str | None = None,
        preempt: bool = False,
        drift: Drift | None = None,
        slower: dict[str, float] | None = None,
    ) -> None:
        self.profile = p = profile
        self.block_size = p.block_size
        capacity = p.kv_capacity_tokens if kv_capacity is None else kv_capacity
        self.num_blocks = capacity // p.block_size
        self.kv_capacity = self.num_blocks * p.block_size
        self.pool = BlockPool(self.num_blocks)
        self.speed = speed
        self.drift = drift
        slow = slower or {}
        self._decode_x, self._prefill_x, self._frontend_x = (
            1.0 + slow.get(part, 0.0) for part in SLOWER_PARTS
        )
        self.noise = noise
        self.max_num_seqs = p.max_num_seqs if max_num_seqs is None else max_num_seqs
        self.preempt = preempt
        self.rng = np.random.default_rng([seed, 0])
        self.noise_rng = np.random.default_rng([seed, 1])
        k = p.num_speculative_tokens
        self.text_accept = acceptance == "text"
        if acceptance is None or isinstance(acceptance, str):
            conditional = tuple(p.draft_acceptance[:k])
        else:
            conditional = (conditional_acceptance(acceptance, k),) * k
        survival, acc = [], 1.0
        for a in conditional:
            acc *= a
            survival.append(acc)
        self._survival = tuple(survival)
        self.decode_cost_tokens = 1 + k
        self.pending: list[tuple[float, int, SimRequest]] = []
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self.stats.spec_kept = [0] * (len(survival) + 1)

    # -- requests -------------------------------------------------------------------------

    def add(self, req: SimRequest, now: float) -> None:
        """Accept a request at ``now``; it reaches the scheduler after the front-end delay."""
        p = self.profile
        req.arrival = now
        delay = (p.frontend_base_s + p.frontend_per_prompt_token_s * req.prompt_len) * (
            self._frontend_x / self.speed_now()
        )
        req.ready_at = now + delay
        req.block_hashes = block_hashes(req.prompt_ids, self.block_size)
        req.prefill_target = req.prompt_len
        if req.ignore_eos or p.eos_probability <= 0:
            req.stop_at = req.max_tokens + 1
        else:
            req.stop_at = req.min_tokens + int(self.rng.geometric(p.eos_probability))
        req.spec_u = float(self.rng.random())
        if self.text_accept and self._survival:
            a = text_acceptance(predictability(req.prompt_ids))
            req.survival = tuple(a ** (i + 1) for i in range(len(self._survival)))
        req.state = WAITING
        heapq.heappush(self.pending, (req.ready_at, req.seq, req))

    def abort(self, req: SimRequest) -> None:
        """Remove a request wherever it is (client gone); frees its blocks."""
        if req.state == FINISHED:
            return
        if req.state == RUNNING:
            self.running.remove(req)
            self.pool.release(req.ref_hashes, req.anon_blocks)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.state = FINISHED
        req.finish_reason = req.finish_reason or "abort"
        self.stats.finished["abort"] = self.stats.finished.get("abort", 0) + 1

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.used / self.num_blocks if self.num_blocks else 0.0

    # -- scheduling -----------------------------------------------------------------------

    def _promote(self, now: float) -> None:
        pending = self.pending
        while pending and pending[0][0] <= now:
            req = heapq.heappop(pending)[2]
            if req.state == WAITING:
                self.waiting.append(req)

    def _blocks_for(self, req: SimRequest, budget: int) -> tuple[int, int]:
        """(cached prefix blocks, blocks to allocate) to admit ``req``: its whole footprint,
        or with ``preempt`` the blocks of its first chunk under ``budget``."""
        bs = self.block_size
        hits = self.pool.hit_blocks(req.block_hashes, (req.prompt_len - 1) // bs)
        if self.preempt:
            computed = hits * bs
            total = -(-(computed + min(req.prefill_target - computed, budget)) // bs)
        else:
            total = -(-(req.prompt_len + req.max_tokens) // bs)
        return hits, total - hits

    def _fits(self, req: SimRequest) -> bool:
        if len(self.running) >= self.max_num_seqs:
            return False
        hits, need = self._blocks_for(req, self.profile.max_num_batched_tokens)
        return self.pool.can_allocate(req.block_hashes, hits, need)

    def next_event(self, now: float) -> float | None:
        """Earliest time a step could do work: ``now``, a later time, or None (idle)."""
        self._promote(now)
        later: list[float] = []
        for req in self.running:
            if req.paused_until <= now:
                return now
            later.append(req.paused_until)
        if self.waiting and self._fits(self.waiting[0]):
            return now
        while self.pending and self.pending[0][2].state != WAITING:
            heapq.heappop(self.pending)
        if self.pending:
            later.append(self.pending[0][0])
        return min(later) if later else None

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        """``preempt`` mode: give ``req`` the blocks to hold ``tokens``, preempting the newest
        running requests while they do not fit (vLLM's FCFS rule); False if ``req`` itself
        had to go."""
        held = len(req.ref_hashes) + req.anon_blocks
        extra = -(-tokens // self.block_size) - held
        if extra <= 0:
            return True
        pool = self.pool
        while not pool.can_allocate((), 0, extra):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        pool.allocate((), 0, extra)
        req.anon_blocks += extra
        return True

    def _preempt(self, req: SimRequest) -> None:
        """Free a running request's blocks and put it back at the head of the waiting queue;
        readmitted, it computes its prompt and the tokens it had generated again."""
        self.running.remove(req)
        self.pool.release(req.ref_hashes, req.anon_blocks)
        req.ref_hashes = []
        req.anon_blocks = 0
        req.next_block = 0
        req.computed = 0
        req.prefill_target = req.prompt_len + req.output
        req.preemptions += 1
        req.state = WAITING
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def plan(self, now: float) -> StepPlan | None:
        """Pick the next step's batch (FCFS, chunked prefill under the token budget)."""
        self._promote(now)
        p = self.profile
        budget = p.max_num_batched_tokens
        decode: list[SimRequest] = []
        prefill: list[tuple[SimRequest, int]] = []
        cost = self.decode_cost_tokens
        drafts = cost - 1
        preempted = self.stats.preemptions
        running = self.running
        i = 0
        while i < len(running):
            req = running[i]
            i += 1
            if req.paused_until > now or budget <= 0:
                continue
            remaining = req.prefill_target - req.computed
            if remaining > 0:
                n = min(remaining, budget)
                if self.preempt and not self._grow(req, req.computed + n):
                    break
                prefill.append((req, n))
                budget -= n
            elif budget >= cost:
                if self.preempt:
                    limit = req.prompt_len + req.max_tokens
                    if not self._grow(req, min(req.prompt_len + req.output + drafts, limit)):
                        break
                decode.append(req)
                budget -= cost
        # as vLLM: no request is admitted in a step that preempted one
        while (
            preempted == self.stats.preemptions
            and self.waiting
            and budget > 0
            and len(running) < self.max_num_seqs
        ):
            req = self.waiting[0]
            hits, need = self._blocks_for(req, budget)
            if not self.pool.can_allocate(req.block_hashes, hits, need):
                break
            self.waiting.popleft()
            self.pool.allocate(req.block_hashes, hits, need)
            bs = self.block_size
            req.ref_hashes = list(req.block_hashes[:hits])
            req.next_block = hits
            req.anon_blocks = need
            req.computed = hits * bs
            if req.scheduled_at is None:  # the first admission (a preempted one is not counted)
                req.cached_tokens = req.computed
                self.stats.prefix_queries += req.prompt_len
                self.stats.prefix_hits += hits * bs
                req.scheduled_at = max(now, req.ready_at)
            req.state = RUNNING
            running.append(req)
            n = min(req.prefill_target - req.computed, budget)
            prefill.append((req, n))
            budget -= n
        if not decode and not prefill:
            if preempted != self.stats.preemptions:
                return self.plan(now)  # all it could run went back to waiting: admit now
            return None
        return StepPlan(
            decode, prefill, self.step_time(decode, prefill), self.read_bytes(decode, prefill)
        )

    def read_bytes(
        self, decode: Sequence[SimRequest], prefill: Sequence[tuple[SimRequest, int]]
    ) -> float:
        """Bytes one step reads (vLLM's ``estimated_read_bytes_per_gpu``): the weights once,
        and the KV cache of each decoding request's context (prompt + output so far) and of
        each prefill chunk's context (computed + the chunk)."""
        p = self.profile
        ctx = sum(r.prompt_len + r.output for r in decode)
        ctx += sum(req.computed + q for req, q in prefill)
        return p.weight_bytes + p.kv_bytes_per_token * ctx

    def step_time(
        self, decode: Sequence[SimRequest], prefill: Sequence[tuple[SimRequest, int]]
    ) -> float:
        """Seconds one step takes, after ``--speed`` and ``--noise``."""
        p = self.profile
        n = len(decode)
        ctx = sum(r.prompt_len + r.output for r in decode)
        t = (
            p.step_base_s
            + p.decode_per_seq_s * n
            + p.decode_per_seq_sq_s * n * n
            + p.decode_per_context_token_s * ctx
        ) * self._decode_x
        chunks = 0.0
        for req, q in prefill:
            chunks += p.prefill_per_token_s * q + p.prefill_attention_s * q * (req.computed + q / 2)
        t += chunks * self._prefill_x
        if self.noise > 0:
            t *= math.exp(
                self.noise * float(self.noise_rng.standard_normal()) - self.noise * self.noise / 2
            )
        return t / self.speed_now()

    def speed_now(self) -> float:
        """``speed`` times the drift's factor now (exactly ``speed`` without drift)."""
        return self.speed if self.drift is None else self.speed * self.drift.factor()

    # -- completing a step ----------------------------------------------------------------

    def complete(self, plan: StepPlan, now: float) -> list[tuple[SimRequest, int, str | None]]:
        """Apply a finished step at ``now``: new tokens per request, finished requests freed."""
        outputs: list[tuple[SimRequest, int, str | None]] = []
        stats = self.stats
        bs = self.block_size
        pool = self.pool
        stats.step_seconds += plan.duration
        stats.read_bytes += plan.read_bytes
        step_tokens = 0  # generated, and the computed prompts of this step's first tokens
        for req, q in plan.prefill:
            if req.state != RUNNING:
                continue
            req.computed += q
            hashes = req.block_hashes
            while req.next_block < len(hashes) and (req.next_block + 1) * bs <= req.computed:
                h = hashes[req.next_block]
                if pool.register(h):
                    req.ref_hashes.append(h)
                    req.anon_blocks -= 1
                req.next_block += 1
            if req.computed >= req.prefill_target:
                if req.first_token_time is None:
                    stats.prompt_tokens += req.prompt_len
                    stats.prompt_cached += req.cached_tokens
                    stats.prompt_computed += req.prompt_len - req.cached_tokens
                    step_tokens += req.prompt_len - req.cached_tokens
                    stats.ttft.observe(now - req.arrival)
                    req.first_token_time = now
                else:  # recomputed after a preemption: the next token
                    stats.itl.observe(now - req.last_token_time)
                out = self._advance(req, 1, now)
                step_tokens += out[1]
                outputs.append(out)
        decode = [r for r in plan.decode if r.state == RUNNING]
        if decode:
            survival = self._survival
            kept_steps = stats.spec_kept
            stats.spec_drafts += len(decode)
            stats.spec_draft_tokens += len(decode) * len(survival)
            itl = stats.itl
            for req in decode:
                u = req.spec_u = (req.spec_u + GOLDEN) % 1.0
                k = 0
                for s in req.survival or survival:
                    if u >= s:
                        break
                    k += 1
                itl.observe(now - req.last_token_time)
                out = self._advance(req, 1 + k, now)
                step_tokens += out[1]
                kept = out[1] - 1  # a last step cut at max_tokens keeps what was streamed
                stats.spec_accepted += kept
                kept_steps[kept] += 1
                outputs.append(out)
        if outputs:  # as vLLM: one observation per step that produced output
            stats.iteration_tokens.observe(step_tokens)
        return outputs

    def _advance(self, req: SimRequest, n: int, now: float) -> tuple[SimRequest, int, str | None]:
        limit = min(req.max_tokens, req.stop_at)
        if req.fault is not None:
            limit = min(limit, req.fault_at)
        n = max(0, min(n, limit - req.output))
        req.output += n
        req.last_token_time = now
        self.stats.generation_tokens += n
        finish: str | None = None
        if req.output >= req.stop_at:
            finish = "stop"
        elif req.output >= req.max_tokens:
            finish = "length"
        elif req.fault is not None and req.output >= req.fault_at:
            if req.fault == "stall":
                req.paused_until = now + req.stall_s / self.speed
                req.fault = None
            else:
                finish = req.fault
        if finish is not None:
            self._finish(req, finish)
        return req, n, finish

    def _finish(self, req: SimRequest, reason: str) -> None:
        self.running.remove(req)
        self.pool.release(req.ref_hashes, req.anon_blocks)
        req.state = FINISHED
        req.finish_reason = reason
        stats = self.stats
        stats.finished[reason] = stats.finished.get(reason, 0) + 1
        if req.scheduled_at is not None and req.first_token_time is not None:
            stats.queue_time.observe(req.scheduled_at - req.ready_at)
            stats.prefill_time.observe(req.first_token_time - req.scheduled_at)
            stats.decode_time.observe(req.last_token_time - req.first_token_time)
