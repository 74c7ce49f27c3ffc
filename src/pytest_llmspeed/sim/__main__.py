"""``python -m pytest_llmspeed.sim`` / ``llmspeed-sim``: serve until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading

from . import QUIRKS, SimOptions, accept_value
from .faults import __doc__ as FAULTS_DOC
from .profiles import PROFILES


def build_parser() -> argparse.ArgumentParser:
    profiles = "\n".join(f"  {name}: {p.description}" for name, p in sorted(PROFILES.items()))
    parser = argparse.ArgumentParser(
        prog="llmspeed-sim",
        description="A simulated vLLM server (OpenAI-compatible HTTP) for pytest-llmspeed.",
        epilog=f"profiles:\n{profiles}\n\n--faults grammar:\n{FAULTS_DOC}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile",
        default="tiny",
        choices=sorted(PROFILES),
        help="simulated deployment (default: tiny)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind; 0 picks a free one (default 8000)"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="divide every simulated time by X: 10 is ten times faster, 0.9 a "
        "10%% slower machine (default 1)",
    )
    parser.add_argument(
        "--kv-capacity",
        type=int,
        default=None,
        metavar="TOKENS",
        help="KV cache size in tokens (default: the profile's)",
    )
    parser.add_argument(
        "--enable-mfu-metrics",
        action="store_true",
        help="expose vLLM's MFU counter vllm:estimated_read_bytes_per_gpu_total (the bytes the "
        "steps read, from the profile's weight and KV bytes)",
    )
    parser.add_argument(
        "--kv-preempt",
        type=int,
        default=None,
        metavar="TOKENS",
        help="a KV cache of TOKENS allocated as vLLM allocates it: when the running contexts "
        "outgrow it the newest running request is preempted and later recomputed (instead "
        "of --kv-capacity, whose requests wait and are never preempted)",
    )
    parser.add_argument(
        "--accept",
        type=accept_value,
        default=None,
        metavar="RATE",
        help="drafts' acceptance rate, accepted / draft tokens, in [0, 1] "
        "(default: the profile's); moves acceptance length only; or text: each request's "
        "from how predictable its prompt is (the share of its last 2,048 tokens' trigrams "
        "seen earlier in it)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        metavar="N",
        help="most requests running at once, as vLLM's --max-num-seqs (default: the "
        "profile's); the rest wait",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="TOKENS",
        help="largest prompt + output per request (default: the profile's)",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="seeded multiplicative jitter on step times, e.g. 0.03 (default 0)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of every random draw in a run (default 0)"
    )
    parser.add_argument(
        "--start-noise",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="between-start noise: this start's speed is multiplied by exp(F*z - F^2/2), z "
        "standard normal, e.g. 0.03 (default 0)",
    )
    parser.add_argument(
        "--start-seed",
        type=int,
        default=None,
        metavar="N",
        help="seed of the start factor's draw (default: fresh OS entropy at each start)",
    )
    parser.add_argument(
        "--drift",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="the speed wanders over minutes within +-FRACTION, the same for every start with "
        "the same --drift-seed at the same moment, e.g. 0.2 (default 0)",
    )
    parser.add_argument(
        "--drift-period",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="about one swing of the drift per this many seconds (default 300)",
    )
    parser.add_argument(
        "--drift-seed", type=int, default=0, metavar="N", help="seed of the drift (default 0)"
    )
    parser.add_argument(
        "--slower",
        default=None,
        metavar="PART:FRACTION",
        help="a second version with one factor slower, every draw the same: decode, prefill "
        "or frontend times x (1 + FRACTION), e.g. decode:0.1 (several: comma-separated)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* routes",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        metavar="K",
        help="send a stream's tokens in chunks of at least K (the first at once), "
        "as vLLM's --stream-interval (default 1)",
    )
    parser.add_argument(
        "--faults",
        default=None,
        metavar="SPEC",
        help="inject failures, e.g. 'start500=0.05,midstream=0.01,drop=0.01,"
        "stall=0.01,burst503=0.02' (grammar below)",
    )
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when standard input closes: a parent that holds the other end (the "
        "plugin) takes the simulator with it however it ends, even killed",
    )
    parser.add_argument(
        "--quirks",
        default=None,
        metavar="LIST",
        help="behave like a less vLLM-like server, comma-separated: "
        + "; ".join(f"{k}: {v}" for k, v in QUIRKS.items()),
    )
    return parser


async def serve(options: SimOptions, exit_with_stdin: bool = False) -> None:
    """Run until SIGINT or SIGTERM (or, with ``exit_with_stdin``, standard input's end)."""
    from .server import SimServer

    server = SimServer(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:

        def watch() -> None:
            # os.read, not sys.stdin's buffer: a daemon thread blocked in a buffered read
            # holds its lock, and an interpreter that exits meanwhile (a start that failed)
            # aborts on it ("could not acquire lock for <stdin> at interpreter shutdown")
            fd = sys.stdin.fileno()
            while os.read(fd, 4096):
                pass
            with contextlib.suppress(RuntimeError):  # the loop closed already
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch, daemon=True).start()
    try:
        url = await server.start()
        start = f", start factor {server.start_factor!r}" if options.start_noise else ""
        print(
            f"llmspeed-sim listening on {url} (profile {options.profile}, speed "
            f"{options.speed:g}, model {server.model_name}{start})",
            flush=True,
        )
        await stop.wait()
    finally:
        await server.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = SimOptions(
            profile=args.profile,
            host=args.host,
            port=args.port,
            speed=args.speed,
            kv_capacity=args.kv_capacity,
            max_model_len=args.max_model_len,
            noise=args.noise,
            seed=args.seed,
            start_noise=args.start_noise,
            start_seed=args.start_seed,
            api_key=args.api_key,
            stream_interval=args.stream_interval,
            faults=args.faults,
            quirks=args.quirks,
            accept=args.accept,
            max_num_seqs=args.max_num_seqs,
            kv_preempt=args.kv_preempt,
            mfu_metrics=args.enable_mfu_metrics,
            drift=args.drift,
            drift_period=args.drift_period,
            drift_seed=args.drift_seed,
            slower=args.slower,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(options, exit_with_stdin=args.exit_with_stdin))
    except OSError as exc:
        print(f"llmspeed-sim: cannot start: {exc}", file=sys.stderr)
        sys.exit(1)
    print("llmspeed-sim stopped", flush=True)


if __name__ == "__main__":
    main()
