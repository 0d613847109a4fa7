"""Publisher child of test_rmq_crash: one message per Publish frame, each confirmed before the next (a raw
stop-and-wait client, as rbfly's ``send``), under the publisher reference "p", until killed. Appends the
publishing id of every confirmed message to a file (one os.write per confirm), so the file holds exactly
what the broker confirmed. Body of message i = b"crash-<i>"."""

import os
import sys

import rawwire


def main(port, stream, path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    c = rawwire.RawClient(port)
    assert c.handshake() == rawwire.OK
    assert c.declare_publisher(1, stream, ref="p") == rawwire.OK
    i = 1
    while True:
        confirmed, errors = c.publish_confirmed(1, [(i, b"crash-%d" % i)])
        if confirmed != {i} or errors:
            raise SystemExit(f"message {i}: confirmed {confirmed}, errors {errors}")
        os.write(fd, b"%d\n" % i)
        i += 1


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
