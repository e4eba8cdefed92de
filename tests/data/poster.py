"""Post N user messages to a Kesoku database from a separate process, printing each id once stored.

Usage: python poster.py DB_PATH SESSIONS_DIR CHANNEL COUNT [PAUSE_EVERY]
"""

import sys

import trio

from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.vocab.model import user_text


async def main(db_path: str, sessions_dir: str, channel: str, count: int, pause_every: int) -> None:
    gateway = Gateway(Store(db_path), sessions_dir)
    session = gateway.open_session("proc", channel)
    for i in range(count):
        msg = await gateway.post(
            user_text(session.id, f"{channel}-{i}", external_id=f"{channel}-{i}")
        )
        print(msg.id, flush=True)  # printed only after post() returned: the message is durable
        if pause_every and i % pause_every == 0:
            await trio.sleep(0.001)


if __name__ == "__main__":
    db, sessions, chan, n = sys.argv[1:5]
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    trio.run(main, db, sessions, chan, int(n), every)
