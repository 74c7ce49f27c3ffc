"""Request and first-token times on the wire (loopback), for telling server time from client time.

Run as a child process (root: it opens an AF_PACKET socket on ``lo``): it prints one JSON line
per event on TCP connections to ``--port``, with the kernel's receive timestamp converted to
``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every process on Linux):

- ``{"t": ..., "conn": client_port, "ev": "post", "rid": true|false}`` — a segment from a
  client that starts a request (``POST ``); ``rid``: it carries an ``x-request-id`` header
  (`vllm bench serve` sends one, the plugin does not);
- ``{"t": ..., "conn": client_port, "ev": "token"}`` — a segment from the server that carries an
  SSE chunk with output text (``"text":`` or ``"content":``).

A client's TTFT minus the wire's (first ``token`` after a ``post`` on the same connection) is the
client's own share: the time before its request reached the socket and after the chunk did.
Used by ``python -m benchmarks.studies.side_by_side_vllm_bench --wire``, which starts it as
``python -m benchmarks.studies.wire_sniffer --port PORT``.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
PACKET_OUTGOING = 4


def clock_offset_ns() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC, the smallest of a few close reads."""
    best = None
    for _ in range(50):
        a = time.perf_counter_ns()
        r = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    assert best is not None
    return best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="the server's TCP port")
    args = ap.parse_args()
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
    sock.bind(("lo", 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024 * 1024)
    offset = clock_offset_ns()
    out = sys.stdout
    print(json.dumps({"ev": "ready"}), flush=True)
    while True:
        data, anc, _, addr = sock.recvmsg(65600, 64)
        if addr[2] == PACKET_OUTGOING:  # loopback shows each packet twice: keep the arrival
            continue
        t_ns = None
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", raw[:16])
                t_ns = sec * 1_000_000_000 + nsec
        if t_ns is None or len(data) < 14 + 20 or data[12:14] != b"\x08\x00":
            continue
        ip = data[14:]
        if ip[9] != 6:  # TCP
            continue
        ihl = (ip[0] & 0x0F) * 4
        tcp = ip[ihl:]
        sport, dport = struct.unpack("!HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if not payload:
            continue
        t = (t_ns - offset) / 1e9
        if dport == args.port and payload.startswith(b"POST "):
            rid = b"x-request-id" in payload.lower()
            out.write(json.dumps({"t": t, "conn": sport, "ev": "post", "rid": rid}) + "\n")
        elif sport == args.port and (b'"text":' in payload or b'"content":' in payload):
            out.write(json.dumps({"t": t, "conn": dport, "ev": "token"}) + "\n")
        else:
            continue
        out.flush()


if __name__ == "__main__":
    main()
