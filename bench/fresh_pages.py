#!/usr/bin/env python3
"""How long this machine takes to fault in fresh memory: touches GIB GiB of new anonymous
memory one page at a time, ROUNDS times, right after freeing it, then once more after
PAUSE seconds idle.

On a VM whose balloon device reports free pages to its host, memory the guest freed and
left idle is taken back, and every page of it faults on the host when touched again;
a cold step of bench/compare.sh (started 3 s after dropping the page cache) pays that
for every fresh page it takes. docs/BENCHMARKS.md has the figures for this machine.

    python3 bench/fresh_pages.py [GIB [ROUNDS [PAUSE]]]    # default 2 3 10
"""
import mmap
import sys
import time

PAGE = mmap.PAGESIZE


def touch(size):
    start = time.monotonic()
    memory = mmap.mmap(-1, size)
    for offset in range(0, size, PAGE):
        memory[offset] = 1
    memory.close()
    return time.monotonic() - start


def main():
    defaults = [2, 3, 10]
    given = [int(a) for a in sys.argv[1:4]]
    gib, rounds, pause = given + defaults[len(given):]
    size = gib << 30
    for r in range(rounds):
        print(f"touch {gib} GiB, round {r + 1}: {touch(size):.2f} s", flush=True)
    time.sleep(pause)
    print(f"touch {gib} GiB after {pause} s idle: {touch(size):.2f} s", flush=True)


if __name__ == "__main__":
    main()
