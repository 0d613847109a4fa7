"""``riverbed serve`` that kills itself (SIGKILL) right after it sent a chunk to its members ahead of its
own commit of it (shells/cluster/leader_path.py), for tests/cluster/test_send_ahead.py.

Run as ``ServerProcess(..., wrap=[sys.executable, THIS_FILE])``: the command it gets is the usual
``python -m riverbed.shells.cli serve ...``. ``RIVERBED_TEST_DIE_AT_SEND_AHEAD=N``: the Nth chunk sent ahead
is the last thing this process does; it waits ``RIVERBED_TEST_DIE_WAIT`` seconds first (default 0.3, its
loop blocked) so that the members surely store the chunk and acknowledge it, unread, before the kill.
"""

import os
import signal
import sys
import time


def main():
    argv = sys.argv[1:]
    serve_args = argv[argv.index("riverbed.shells.cli") + 1:]
    at = int(os.environ["RIVERBED_TEST_DIE_AT_SEND_AHEAD"])
    wait = float(os.environ.get("RIVERBED_TEST_DIE_WAIT", "0.3"))
    from riverbed.shells.cluster import leader_path
    sealed = leader_path.SendAhead.sealed

    def sealed_then_die(self, name, chunk_id, records, chunk, sequences):
        sent = sealed(self, name, chunk_id, records, chunk, sequences)
        if sent and self.sent >= at:
            sys.stderr.write(f"die_after_send_ahead: chunk {chunk_id} of {name} sent, not committed: dying\n")
            sys.stderr.flush()
            time.sleep(wait)
            os.kill(os.getpid(), signal.SIGKILL)
        return sent
    leader_path.SendAhead.sealed = sealed_then_die
    from riverbed.shells.cli import main as cli_main
    sys.exit(cli_main(serve_args))


if __name__ == "__main__":
    main()
