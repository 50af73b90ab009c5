#!/usr/bin/env python3
"""How fast this machine's disk makes new data durable: the floor under a first backup of
incompressible data, which must write about as much as it reads and fsync it.

Writes COUNT files of 16 MiB of random bytes into DIR, five ways, and prints the seconds
each took: with O_DIRECT or through the page cache, each file fsynced (as a backup's
packs are) or one sync at the end, and as cairn's local backend writes packs: through
the page cache, writeback started after each MiB (sync_file_range), each file fsynced and
its pages then dropped. "direct, no sync" is the device's write speed before its cache
is flushed; the others include the flush.

usage: bench/durable_write.py DIR [COUNT]     (COUNT defaults to 60, about 1 GB)
"""

import ctypes
import mmap
import os
import sys
import time

FILE = 16 << 20
WRITE = 1 << 20


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2


def run(directory, count, direct, sync):
    # O_DIRECT wants aligned memory: an anonymous map is page-aligned.
    buf = mmap.mmap(-1, WRITE)
    buf.write(os.urandom(WRITE))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    names = [os.path.join(directory, f"durable-write-{i}") for i in range(count)]
    os.sync()
    started = time.monotonic()
    for name in names:
        fd = os.open(name, flags, 0o600)
        for at in range(0, FILE, WRITE):
            os.pwrite(fd, buf, at)
            if sync == "writeback":
                LIBC.sync_file_range(fd, at, WRITE, SYNC_FILE_RANGE_WRITE)
        if sync in ("each", "writeback"):
            os.fsync(fd)
        if sync == "writeback":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    if sync == "end":
        os.sync()
    took = time.monotonic() - started
    for name in names:
        os.unlink(name)
    return took


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    directory = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) == 3 else 60
    mib = count * FILE >> 20
    for direct, sync, label in [
        (True, "none", "direct, no sync"),
        (True, "each", "direct, fsync each file"),
        (False, "each", "page cache, fsync each file"),
        (False, "end", "page cache, one sync at the end"),
        (False, "writeback", "page cache, writeback each MiB, fsync each file (cairn)"),
    ]:
        took = run(directory, count, direct, sync)
        print(f"{label}: {mib} MiB in {took:.2f} s, {mib / took:.0f} MiB/s")
        time.sleep(3)


if __name__ == "__main__":
    main()
