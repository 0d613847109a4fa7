"""Publisher child of test_rmq_crash: publishes with rstream until killed, and appends the publishing id
of every confirmed message to a file (unbuffered, one os.write per confirm callback) so the file holds
exactly what the broker confirmed. Body of message i = b"crash-<i>"."""

import asyncio
import os
import sys

from rstream import Producer


async def main(port, stream, path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_confirm(status):
        if status.is_confirmed:
            os.write(fd, b"%d\n" % status.message_id)

    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        i = 1
        while True:
            await p.send_batch(stream, [b"crash-%d" % j for j in range(i, i + 500)], on_publish_confirm=on_confirm)
            i += 500
            await asyncio.sleep(0.002)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
