"""The farm's direct worker channel: framing and the token check (real sockets, no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from rollout.farm.channel import ChannelClosed, connect, encode_frame, read_frame, serve


@pytest.mark.parametrize("unix", [True, False])
def test_channel_round_trip_and_token_check(unix):
    async def main():
        seen = []

        async def echo(reader, writer):
            seen.append("authenticated")
            while True:
                try:
                    obj = await read_frame(reader)
                except ChannelClosed:
                    return
                writer.write(encode_frame({"echo": obj}))

        server = await serve(echo, b"secret-token", unix=unix)
        try:
            reader, writer = await connect(server.address, b"secret-token")
            writer.write(encode_frame([1, "two", {"three": 3.0}]))
            assert await read_frame(reader) == {"echo": [1, "two", {"three": 3.0}]}
            writer.close()

            reader, writer = await connect(server.address, b"wrong-token")
            writer.write(encode_frame("let me in"))
            with pytest.raises(ChannelClosed):
                await read_frame(reader)  # the worker hangs up without unpickling anything
            assert seen == ["authenticated"]
        finally:
            server.close()

    asyncio.run(main())
