#!/usr/bin/env python3
"""The benchmark's second corpus, and the in-place changes between backups of both.

  corpus.py mixed DIR [--scale S]      writes the mixed corpus under DIR (once)
  corpus.py change DIR --kind K --state 0|1

`mixed` is data as people back it up, mostly incompressible: camera photos (JPEG
headers over random bytes), phone videos (MP4 'ftyp' boxes), zip archives and office
documents (real deflate, made with zipfile), raw disk images (random blocks with runs of
zeros), and some CSV, XML, logs and small config files that compress well. About
1.1 GB at scale 1, from a fixed seed: every run and every tool sees the same bytes.

`change` moves a tree between state 0 (as generated or unpacked) and state 1 (the
"after changes" state), touching only what differs, so the tree goes back to state 0
for the next tool in seconds, without deleting gigabytes (see compare.sh on deletions):
- mixed: 64 KiB overwritten in place at a few offsets in disk images and videos, lines
  appended to logs, rows of a CSV rewritten in place, new photos added, one document
  replaced by a new version.
- linux: a line appended to 1 file in 100 and a new directory of 40 files.
Going back to state 0 restores the original bytes (sizes and contents; not mtimes).
"""

import argparse
import io
import os
import random
import sys
import zipfile

MIB = 1 << 20
SEED = 20261124


def rng_for(*parts):
    return random.Random(f"{SEED}/" + "/".join(str(p) for p in parts))


def random_bytes(rng, n):
    return rng.randbytes(n)


WORDS = (
    "backup restore archive snapshot invoice quarterly report meeting schedule budget "
    "customer order product shipment warehouse payroll contract summary draft final "
    "photo holiday family garden kitchen project status review deadline milestone"
).split()


def text_lines(rng, n):
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) + "\n" for _ in range(n)
    )


def jpeg(rng, size):
    # SOI, APP1 "Exif", then entropy-coded data: random bytes, as a compressed image is.
    head = b"\xff\xd8\xff\xe1\x00\x16Exif\x00\x00MM\x00\x2a" + bytes(8)
    return head + random_bytes(rng, size - len(head) - 2) + b"\xff\xd9"


def mp4(rng, size):
    head = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41"
    mdat = (size - len(head)).to_bytes(4, "big") + b"mdat"
    return head + mdat + random_bytes(rng, size - len(head) - len(mdat))


def disk_image(rng, size):
    out = bytearray()
    while len(out) < size:
        n = min(rng.choice([64, 256, 1024]) * 1024, size - len(out))
        out += bytes(n) if rng.random() < 0.25 else random_bytes(rng, n)
    return bytes(out)


def zip_archive(rng, members, office=False):
    buf = io.BytesIO()
    # A fixed time in every member, so the same archive comes out every time.
    member = lambda name: zipfile.ZipInfo(name, (2025, 6, 1, 12, 0, 0))  # noqa: E731
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if office:
            z.writestr(member("[Content_Types].xml"), '<?xml version="1.0"?><Types/>')
        for i in range(members):
            if rng.random() < 0.3:
                z.writestr(member(f"media/image{i}.jpg"), jpeg(rng, rng.randint(50, 400) * 1024))
            else:
                text = "<w:p>" + text_lines(rng, 800) + "</w:p>"
                z.writestr(member(f"word/part{i}.xml"), text, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def csv_table(rng, rows):
    out = ["id,date,customer,amount,status\n"]
    for i in range(rows):
        out.append(
            f"{i},2026-{rng.randint(1, 12):02}-{rng.randint(1, 28):02},"
            f"{rng.choice(WORDS)} {rng.choice(WORDS)},{rng.randint(1, 99999) / 100:.2f},"
            f"{rng.choice(['paid', 'open', 'late'])}\n"
        )
    return "".join(out).encode()


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def generate(root, scale):
    rng = rng_for("layout")
    n = lambda k: max(1, int(k * scale))  # noqa: E731
    for i in range(n(140)):
        write(f"{root}/photos/2025/IMG_{i:04}.jpg", jpeg(rng_for("jpg", i), rng.randint(2, 5) * MIB))
    for i in range(n(4)):
        write(f"{root}/videos/VID_{i:03}.mp4", mp4(rng_for("mp4", i), rng.randint(40, 70) * MIB))
    for i in range(n(2)):
        write(f"{root}/vm/disk{i}.img", disk_image(rng_for("img", i), 96 * MIB))
    for i in range(n(12)):
        write(f"{root}/archives/export-{i:02}.zip", zip_archive(rng_for("zip", i), 20))
    for i in range(n(30)):
        ext = rng.choice(["docx", "xlsx", "pptx"])
        write(f"{root}/documents/report-{i:02}.{ext}", zip_archive(rng_for("doc", i), 4, True))
    for i in range(n(6)):
        write(f"{root}/data/sales-{i}.csv", csv_table(rng_for("csv", i), 150_000))
    for i in range(n(4)):
        body = "".join(f"<record n='{j}'>{text_lines(rng_for('xml', i, j), 3)}</record>\n" for j in range(8000))
        write(f"{root}/data/feed-{i}.xml", body.encode())
    for i in range(n(8)):
        write(f"{root}/logs/app-{i}.log", text_lines(rng_for("log", i), 60_000).encode())
    for i in range(n(2000)):
        d = f"{root}/config/{i % 40:02}"
        write(f"{d}/settings-{i}.conf", text_lines(rng_for("conf", i), rng.randint(2, 60)).encode())


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def original(root, sub, name):
    """The generator's bytes for a video or disk image: its size is the file's, which
    in-place changes keep."""
    i = int("".join(c for c in name.split(".")[0] if c.isdigit()))
    if sub == "vm":
        return disk_image(rng_for("img", i), 96 * MIB)
    return mp4(rng_for("mp4", i), os.path.getsize(f"{root}/{sub}/{name}"))


def change_mixed(root, state):
    # In-place overwrites: the same ranges get state 1's bytes or the originals.
    for sub, name in [("vm", "disk0.img"), ("vm", "disk1.img"), ("videos", "VID_000.mp4")]:
        path = f"{root}/{sub}/{name}"
        if not os.path.exists(path):
            continue
        size = os.path.getsize(path)
        source = None if state == 1 else original(root, sub, name)
        for k in range(4):
            off = size // 5 * (k + 1)
            if state == 1:
                data = random_bytes(rng_for("patch", name, k), 64 * 1024)
            else:
                data = source[off : off + 64 * 1024]
            patch(path, off, data)
    for i in range(2):
        path = f"{root}/logs/app-{i}.log"
        if state == 1:
            with open(path, "ab") as f:
                f.write(text_lines(rng_for("log-append", i), 5000).encode())
        else:
            os.truncate(path, len(text_lines(rng_for("log", i), 60_000).encode()))
    csv = f"{root}/data/sales-0.csv"
    table = csv_table(rng_for("csv", 0), 150_000)
    mid, line = len(table) // 2, b"0,2026-01-01,changed row,0.00,void\n"
    new_rows = line * (4096 // len(line))
    patch(csv, mid, new_rows if state == 1 else table[mid : mid + len(new_rows)])
    doc = next(f"{root}/documents/{d}" for d in sorted(os.listdir(f"{root}/documents")))
    write(doc, zip_archive(rng_for("doc", 0, "v2") if state == 1 else rng_for("doc", 0), 4, True))
    new = f"{root}/photos/2026"
    if state == 1:
        for i in range(10):
            write(f"{new}/IMG_{i:04}.jpg", jpeg(rng_for("new-jpg", i), 3 * MIB))
    elif os.path.isdir(new):
        for n in os.listdir(new):
            os.remove(f"{new}/{n}")
        os.rmdir(new)


def change_linux(root, state):
    files = []
    for d, _, names in os.walk(root):
        if "cairn-bench-new" in d:
            continue
        files += [os.path.join(d, n) for n in names if n.endswith((".c", ".h"))]
    files.sort()
    marker = b"/* changed by bench/corpus.py */\n"
    for path in files[::100]:
        with open(path, "rb") as f:
            data = f.read()
        if state == 1 and not data.endswith(marker):
            with open(path, "ab") as f:
                f.write(marker)
        elif state == 0 and data.endswith(marker):
            os.truncate(path, len(data) - len(marker))
    new = f"{root}/cairn-bench-new"
    if state == 1:
        for i in range(40):
            write(f"{new}/file{i}.c", text_lines(rng_for("linux-new", i), 200).encode())
    elif os.path.isdir(new):
        for n in os.listdir(new):
            os.remove(f"{new}/{n}")
        os.rmdir(new)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mixed")
    m.add_argument("dir")
    m.add_argument("--scale", type=float, default=1.0)
    c = sub.add_parser("change")
    c.add_argument("dir")
    c.add_argument("--kind", choices=["mixed", "linux"], required=True)
    c.add_argument("--state", type=int, choices=[0, 1], required=True)
    a = p.parse_args()
    if a.cmd == "mixed":
        generate(a.dir, a.scale)
    elif a.kind == "mixed":
        change_mixed(a.dir, a.state)
    else:
        change_linux(a.dir, a.state)


if __name__ == "__main__":
    sys.exit(main())
