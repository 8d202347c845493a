"""``pgjobs rate-limit KEY MAX PER [--burst N]`` and ``pgjobs rate-limits``: the rate limits of keys
(``configure_rate_limit``; a queue's own limit is ``pgjobs queue configure NAME --max-starts N --per AGE``).

``MAX 0`` removes a key's limit. ``PER`` is a duration (``1s``, ``500ms`` is ``0.5``, ``1m``, ``1h``).
"""

from __future__ import annotations

import argparse
from typing import Any

from pgjobs.cli.common import EXIT_OK, NEEDS_SCHEMA, open_client, parse_duration, print_json, stdout
from pgjobs.records import RateLimit


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rate-limit",
        help="limit the starts of the jobs of a rate key (MAX 0 removes the limit)",
        description="At most MAX starts of the jobs enqueued with --rate-key KEY in any window of PER (+ burst),"
        " across every worker. MAX 0 removes the limit.",
    )
    p.add_argument("key", metavar="KEY")
    p.add_argument("max_starts", metavar="MAX", type=_count, help="starts per window (0: remove)")
    p.add_argument("per", metavar="PER", type=parse_duration, nargs="?", help="the window: 1s, 0.5, 1m, 1h")
    p.add_argument("--burst", type=_count, default=0, metavar="N", help="starts allowed beyond MAX in any window (0)")
    p.add_argument("--json", action="store_true", help="print the limit as JSON")
    p.set_defaults(func=cmd_rate_limit, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("rate-limits", help="every rate limit (keys and queues), its tokens now and its next token")
    p.add_argument("--json", action="store_true", help="print the limits as JSON")
    p.set_defaults(func=cmd_rate_limits, _needs=NEEDS_SCHEMA)


def _line(limit: RateLimit) -> str:
    per = limit.per.total_seconds()
    text = f"{limit.scope} {limit.key!r}: {limit.max_starts} starts per {per:g} s"
    if limit.burst:
        text += f" (+ burst {limit.burst})"
    if limit.tokens is not None:
        text += f"; {limit.tokens} token(s) now"
        if not limit.tokens and limit.next_token_at is not None:
            text += f", next at {limit.next_token_at.isoformat()}"
    return text


def cmd_rate_limit(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        limit = client.configure_rate_limit(args.key, args.max_starts, args.per, burst=args.burst)
    if args.json:
        print_json(limit)
    elif limit is None:
        stdout().print(f"rate key {args.key!r}: no limit", markup=False)
    else:
        stdout().print(_line(limit), markup=False)
    return EXIT_OK


def cmd_rate_limits(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        limits = client.rate_limits()
    if args.json:
        print_json(limits)
    elif not limits:
        stdout().print("no rate limits")
    else:
        for limit in limits:
            stdout().print(_line(limit), markup=False)
    return EXIT_OK
