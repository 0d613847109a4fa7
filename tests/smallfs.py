"""A small filesystem of a test's own: a tmpfs mounted on a temp directory, unmounted afterwards.

Full-disk tests fill it for real (no mocked statvfs, no fake ENOSPC). Mounting needs root (or
CAP_SYS_ADMIN); without it the tests that use :func:`small_tmpfs` skip and say why.
"""

import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

MIB = 1 << 20


class SmallFs:
    """A mounted tmpfs at ``path``: ``free()`` bytes, ``fill(leave)`` writes a filler file so that about
    ``leave`` bytes stay free, ``unfill()`` deletes it, ``resize(size)`` remounts it bigger."""

    def __init__(self, path):
        self.path = path
        self.filler = os.path.join(path, "filler")

    def free(self):
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave):
        """Take all but ``leave`` bytes with the filler file (in 1 MiB steps; an existing filler grows)."""
        with open(self.filler, "ab") as f:
            block = b"\0" * MIB
            while self.free() - MIB >= leave:
                f.write(block)
                f.flush()
            os.fsync(f.fileno())

    def unfill(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.filler)

    def resize(self, size):
        subprocess.run(["mount", "-o", f"remount,size={size}", self.path], check=True, capture_output=True)


@contextlib.contextmanager
def small_tmpfs(size):
    """Mount a tmpfs of ``size`` (``"48m"``, or bytes) on a new temp directory and yield a SmallFs; always
    unmounted (lazily if something still holds it) and removed afterwards. Skips without permission."""
    if not shutil.which("mount"):
        pytest.skip("no mount command: the full-disk tests need a small tmpfs")
    path = tempfile.mkdtemp(prefix="riverbed-smallfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield SmallFs(path)
    finally:
        if subprocess.run(["umount", path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", path], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(path)
