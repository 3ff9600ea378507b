"""A TCP relay that holds every chunk a fixed delay each way (a slow link), run as a script.

``python relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY`` prints
``ready`` once it listens. Order is kept per direction; the delay is added once per
chunk, so a request and its answer take 2 x DELAY more than on the direct path.
"""

from __future__ import annotations

import asyncio
import sys


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, data = await held.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(data)
            await writer.drain()
        writer.close()

    releasing = asyncio.create_task(release())
    try:
        while data := await reader.read(65536):
            held.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    held.put_nowait((loop.time() + delay, b""))
    await releasing


async def main(listen: str, port: int, target: str, target_port: int, delay: float) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            pump(reader, up_writer, delay), pump(up_reader, writer, delay),
            return_exceptions=True,
        )  # fmt: skip

    server = await asyncio.start_server(serve, listen, port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, target, target_port, delay = sys.argv[1:6]
    asyncio.run(main(host, int(port), target, int(target_port), float(delay)))
