#!/usr/bin/env python3
"""Images whose declared size dwarfs their own, for the memory benchmark (bench/memory/run.sh).

  make_images.py zip OUT.zip SIZE      one deflated member that inflates to SIZE (zip64)
  make_images.py targz OUT.tar.gz SIZE a gzip-compressed tar of SIZE in members of 1 GiB at most
  make_images.py tarbz2 OUT.tar.bz2 SIZE  a tar of one file of SIZE zeros, as bzip2 -9
                                       compresses it (blocks of 46 MB in a few KB)
  make_images.py xzindex OUT.tar.xz SIZE an xz stream of no block whose index of SIZE claims
                                       2-byte records, 4 Mi a 8 MiB (xz -t refuses it)
  make_images.py sqfs-COMP OUT.sqfs SIZE  a squashfs (COMP: gzip, xz, zstd) of one file, a.txt
                                       ("hello\n"), whose inode table holds SIZE of metadata
                                       blocks of zeros before the two inodes (unsquashfs -l
                                       lists it; whoever reads the whole table holds SIZE)
  make_images.py zipnest OUT.zip NAMESxFILES  a zip whose NAMES central directory entries all
                                       name one stored tar of FILES empty files (20000x2000:
                                       2.1 MB, 40 M entries if each name were opened; unzip -t
                                       refuses it as overlapping)
  make_images.py widenest OUT.tar N    a tar of N honest inner tars of one small file each

SIZE is in MiB with an M suffix or in GiB with G (256M, 40G). Both are made in seconds: the deflate stream is one full-flushed segment of 64 KiB
of zeros repeated (a full flush resets the dictionary and aligns to a byte, so segments decode
alone and may follow each other), ended by an empty final block. unzip -t, gzip -t and tar read
them like any other.
"""

import struct
import sys
import zlib

MIB = 1 << 20
# Zeros per segment: a block boundary (a possible checkpoint) every 64 KiB, as a real encoder
# has one every few tens of KiB; 16 segments a MiB.
SEGMENT = 64 << 10
PER_MIB = MIB // SEGMENT


def segment(data):
    """Raw deflate of `data` that decodes on its own and ends on a byte, not final."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


FINAL = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # an empty final block
ZEROS = segment(bytes(SEGMENT))
ZERO_CRC = {}


def crc_of_zeros(n_mib, crc=0):
    chunk = bytes(MIB)
    for _ in range(n_mib):
        crc = zlib.crc32(chunk, crc)
    return crc


def write_zip(out, mib):
    size = mib << 20
    name = b"zeros.bin"
    crc = crc_of_zeros(mib)
    with open(out, "wb") as f:
        # Local header: sizes in the zip64 extra field.
        extra = struct.pack("<HHQQ", 1, 16, size, 0)
        f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc,
                            0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra)) + name + extra)
        start = f.tell()
        for _ in range(mib * PER_MIB):
            f.write(ZEROS)
        f.write(FINAL)
        compressed = f.tell() - start
        # The local header's zip64 field gets the compressed size now known.
        f.seek(start - 8)
        f.write(struct.pack("<Q", compressed))
        f.seek(0, 2)
        cd_start = f.tell()
        extra = struct.pack("<HHQQQ", 1, 24, size, compressed, 0)
        f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 45, 0, 8, 0, 0x21, crc,
                            0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra), 0, 0, 0,
                            0o100644 << 16, 0xFFFFFFFF) + name + extra)
        cd_len = f.tell() - cd_start
        eocd64 = f.tell()
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, cd_len, cd_start))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                            0xFFFFFFFF, 0))


def tar_header(name, size):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % 1_700_000_000
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def write_targz(out, mib):
    # A gzip member: header, raw deflate, CRC-32 and length (mod 2^32) of the decoded bytes.
    crc, length = 0, 0
    with open(out, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03")
        i = 0
        while mib > 0:
            n, mib = min(mib, 1024), mib - min(mib, 1024)
            header = tar_header(b"zeros-%03d.bin" % i, n << 20)
            i += 1
            f.write(segment(header))
            crc, length = zlib.crc32(header, crc), length + len(header)
            for _ in range(n * PER_MIB):
                f.write(ZEROS)
            crc, length = crc_of_zeros(n, crc), length + (n << 20)
        end = bytes(1024)  # the end-of-archive blocks
        f.write(segment(end))
        crc, length = zlib.crc32(end, crc), length + len(end)
        f.write(FINAL)
        f.write(struct.pack("<II", crc, length & 0xFFFFFFFF))


def write_tarbz2(out, mib):
    import bz2

    c = bz2.BZ2Compressor(9)
    with open(out, "wb") as f:
        f.write(c.compress(tar_header(b"zeros.bin", mib * MIB)))
        zeros = bytes(MIB)
        for _ in range(mib):
            f.write(c.compress(zeros))
        f.write(c.compress(bytes(1024)))
        f.write(c.flush())


def vli(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def write_xzindex(out, mib):
    flags = b"\x00\x01"  # check: CRC-32
    header = b"\xfd7zXZ\x00" + flags + struct.pack("<I", zlib.crc32(flags))
    count = (mib * MIB - 16) // 2
    body = b"\x00" + vli(count) + b"\x05\x01" * count
    body += bytes(-len(body) % 4)
    index = body + struct.pack("<I", zlib.crc32(body))
    backward = struct.pack("<I", len(index) // 4 - 1) + flags
    footer = struct.pack("<I", zlib.crc32(backward)) + backward + b"YZ"
    with open(out, "wb") as f:
        f.write(header + index + footer)


SQUASHFS_IDS = {"gzip": 1, "xz": 4, "zstd": 6}


def compress_metadata(comp, data):
    """`data` compressed as a squashfs metadata block of compressor `comp` holds it."""
    if comp == "gzip":
        return zlib.compress(data, 9)
    if comp == "xz":
        import lzma

        return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    import subprocess

    return subprocess.run(["zstd", "-q", "-19", "-c"], input=data, check=True,
                          stdout=subprocess.PIPE).stdout


def write_sqfs(out, comp, mib):
    data = b"hello\n"
    img = bytearray(96)
    blocks_start = len(img)
    img += data  # one data block, stored
    inode_table = len(img)
    zeros = compress_metadata(comp, bytes(8192))
    for _ in range(mib * 128):  # 128 blocks of 8 KiB a MiB
        img += struct.pack("<H", len(zeros)) + zeros
    last = len(img) - inode_table
    # A basic directory (the root) and a basic file: type, mode, uid, gid, mtime, number; then
    # the directory's listing block, links, size + 3, offset, parent; the file's blocks start,
    # no fragment, offset, size, and its one block's size word (bit 24: stored).
    root = struct.pack("<HHHHII", 1, 0o755, 0, 0, 0, 1) + struct.pack("<IIHHI", 0, 2, 28, 0, 3)
    file = struct.pack("<HHHHII", 2, 0o644, 0, 0, 0, 2)
    file += struct.pack("<IIIII", blocks_start, 0xFFFFFFFF, 0, len(data), len(data) | 1 << 24)
    meta = root + file
    img += struct.pack("<H", 0x8000 | len(meta)) + meta  # stored metadata block
    dir_table = len(img)
    listing = struct.pack("<III", 0, last, 2) + struct.pack("<HhHH", len(root), 0, 2, 4) + b"a.txt"
    img += struct.pack("<H", 0x8000 | len(listing)) + listing
    ids = len(img)
    img += struct.pack("<H", 0x8000 | 4) + struct.pack("<I", 0)
    id_table = len(img)
    img += struct.pack("<Q", ids)
    none = 0xFFFFFFFFFFFFFFFF
    img[0:96] = struct.pack("<IIIIIHHHHHHQQQQQQQQ", 0x73717368, 2, 0, 131072, 0,
                            SQUASHFS_IDS[comp], 17, 0, 1, 4, 0, last << 16, len(img), id_table,
                            none, inode_table, dir_table, none, none)
    with open(out, "wb") as f:
        f.write(img)


def inner_tar(files):
    """A tar of `files` empty files, as bytes (GNU tar reads it)."""
    body = b"".join(tar_header(b"f%06d.txt" % i, 0) for i in range(files))
    return body + bytes(1024)


def write_zipnest(out, names, files):
    data = inner_tar(files)
    crc = zlib.crc32(data)
    name = b"c%07d.tar" % 0
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, len(data), len(data),
                        len(name), 0) + name
    central = bytearray()
    for i in range(names):
        n = b"c%07d.tar" % i
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 20, 0, 0, 0, 0x21, crc,
                               len(data), len(data), len(n), 0, 0, 0, 0, 0o100644 << 16, 0) + n
    start = len(local) + len(data)
    count = min(names, 0xFFFF)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), start, 0)
    with open(out, "wb") as f:
        f.write(local + data + central + end)


def write_widenest(out, n):
    with open(out, "wb") as f:
        for i in range(n):
            data = tar_header(b"x.txt", 2) + b"x\n" + bytes(510) + bytes(1024)
            f.write(tar_header(b"n%07d.tar" % i, len(data)) + data)
        f.write(bytes(1024))


if __name__ == "__main__":
    kind, out, size = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "zipnest":
        names, files = (int(x) for x in size.split("x"))
        write_zipnest(out, names, files)
        sys.exit(0)
    if kind == "widenest":
        write_widenest(out, int(size))
        sys.exit(0)
    mib = int(size[:-1]) << {"M": 0, "G": 10}[size[-1].upper()]
    if kind.startswith("sqfs-"):
        write_sqfs(out, kind[len("sqfs-"):], mib)
    else:
        {"zip": write_zip, "targz": write_targz, "tarbz2": write_tarbz2,
         "xzindex": write_xzindex}[kind](out, mib)
