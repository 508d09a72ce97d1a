"""Nexmark's events (an online auction: people register, open auctions, bid), for
``lockstep datagen nexmark`` and ``pipelines/nexmark.sql``.

As in Nexmark's own generator, of every 50 events 1 is a new person, 3 are new auctions and 46
are bids; an auction's seller is a person already made, a bid's auction and bidder are an
auction and a person already made (mostly recent ones: the hot auctions and bidders). Ids
count up from 1000 per kind, prices follow Nexmark's log-uniform cents (100 to 100,000,000),
categories are 10-14, and an auction is open for 2-20 seconds. Times are the produce time.

Example::

    >>> import random
    >>> make = nexmark_events("nexmark")
    >>> events = [make(random.Random(1), 1700000000000) for _ in range(50)]
    >>> sorted({topic for _, _, topic in events})
    ['nexmark_auction', 'nexmark_bid', 'nexmark_person']
    >>> sum(topic == "nexmark_bid" for _, _, topic in events)
    46
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

FIRST_ID = 1000
CATEGORIES = range(10, 15)
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
          "Cheyenne")
CHANNELS = ("Apple", "Google", "Facebook", "Baidu")
HOT = 100  # bids and sellers pick among the newest this many auctions and people, mostly

# (random source, produce time in epoch ms) -> (record key, record, topic)
Event = tuple[str, dict[str, Any], str]


def topics(prefix: str) -> dict[str, str]:
    """The topic of each kind of event: ``{prefix}_person``, ``{prefix}_auction``, ``{prefix}_bid``."""
    return {kind: f"{prefix}_{kind}" for kind in ("person", "auction", "bid")}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def nexmark_events(prefix: str = "nexmark") -> Callable[[random.Random, int], Event]:
    """A maker of Nexmark events in order (see the module docstring); keyed by the person's or
    auction's id (a bid by its auction)."""
    where = topics(prefix)
    count = {"person": 0, "auction": 0, "event": 0}

    def recent(rng: random.Random, kind: str) -> int:
        made = max(count[kind], 1)
        back = rng.randrange(min(made, HOT)) if rng.random() < 0.9 else rng.randrange(made)
        return FIRST_ID + made - 1 - back

    def make(rng: random.Random, ts: int) -> Event:
        n = count["event"] % 50
        count["event"] += 1
        if n == 0 or count["person"] == 0:
            pid = FIRST_ID + count["person"]
            count["person"] += 1
            city = rng.randrange(len(CITIES))
            return str(pid), {
                "id": pid, "name": f"person{pid}", "email_address": f"person{pid}@example.com",
                "credit_card": " ".join(f"{rng.randrange(10000):04d}" for _ in range(4)), "city": CITIES[city],
                "state": STATES[city % len(STATES)], "date_time": _iso(ts), "extra": ""}, where["person"]
        if n <= 3 or count["auction"] == 0:
            aid = FIRST_ID + count["auction"]
            count["auction"] += 1
            initial = _price(rng)
            return str(aid), {
                "id": aid, "item_name": f"item{aid}", "description": f"an item of category {aid % 5 + 10}",
                "initial_bid": initial, "reserve": initial * rng.randint(1, 3), "date_time": _iso(ts),
                "expires": _iso(ts + rng.randrange(2000, 20000)), "seller": recent(rng, "person"),
                "category": rng.choice(CATEGORIES), "extra": ""}, where["auction"]
        auction = recent(rng, "auction")
        channel = rng.randrange(len(CHANNELS) + 3)
        name = CHANNELS[channel] if channel < len(CHANNELS) else f"channel-{channel}"
        return str(auction), {
            "auction": auction, "bidder": recent(rng, "person"), "price": _price(rng), "channel": name,
            "url": f"https://www.nexmark.com/{rng.choice('abc')}/{rng.choice('de')}/item.htm?query=1&channel_id={channel}",
            "date_time": _iso(ts), "extra": ""}, where["bid"]

    return make


def _price(rng: random.Random) -> int:
    """Nexmark's prices: cents, log-uniform between 100 and 100,000,000."""
    return round(10 ** (rng.random() * 6) * 100)
