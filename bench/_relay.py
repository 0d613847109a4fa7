"""The bare relays beside the shell benches (``bson_bench``, ``ream_bench``, ``ws_bench``): the same protocol
library relaying with nothing behind it, run as a child process of the bench so that its CPU is read from
/proc exactly as the broker's is.

A relay script runs :func:`serve_forever` in its ``--relay`` mode; the bench starts it with
:class:`RelayProcess`, which reads the ``listening <kind> 127.0.0.1:<port>`` line the relay prints.
"""

import asyncio
import os
import subprocess
import sys


def serve_forever(start, kind):
    """Run ``await start()`` (it returns the listening port) on uvloop when installed, print the line that
    :class:`RelayProcess` waits for, then serve until the process is killed."""
    async def main():
        port = await start()
        print(f"listening {kind} 127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


class RelayProcess:
    """``script --relay`` as a child process, with the ``port``/``ports``, ``cpu_seconds`` and ``stop`` of the
    benches' ServerProcess. Raises RuntimeError when the relay does not print its listening line."""

    def __init__(self, script, kind):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(script), "--relay"], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening"):
            self.proc.kill()
            self.proc.wait(10)
            raise RuntimeError(f"the {kind} relay did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.ports = {kind: self.port}
        self.pid = self.proc.pid

    def cpu_seconds(self):
        """utime + stime of the relay process so far, in seconds."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(10)
