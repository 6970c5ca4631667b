#!/usr/bin/env python3
"""Writes the seed corpora of the TF_CONFIG and tcp frame fuzzers:
   seeds.py [DIR]   (default: the seeds/ folder next to this script)

tf_config/: TF_CONFIG texts, each after one byte that picks devices per host.
tcp_frames/: inputs of fuzz_tcp_frames.c: a flags byte, then frames as the
tcp backend writes them (tcp.c describes the wire format), checksums already right.
The scenario fuzzer's seeds are the catalogue itself (scenarios/,
scenarios/faults/)."""
import os
import struct
import sys

MAGIC_DATA, MAGIC_RAW, MAGIC_CTL = 0x50545344, 0x58545344, 0x43545344
HELLO, ACK = 0x48545344, 0x41545344
VERSION = 2  # DSIM_TP_VERSION
F_CHECKSUM, F_SIDE = 0x1, 0x4


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def header(magic, src, dst, comm, tag, seq, length, epoch=0, flags=1, checksum=0):
    return struct.pack("<IHHiiIIIIQQ", magic, VERSION, flags, src, dst, comm, epoch, tag, checksum,
                       seq, length)


def frame(magic, body, src=0, dst=1, comm=1, tag=0, seq=0, epoch=0, flags=F_CHECKSUM, side=b""):
    """side: a data frame's 32-byte sideband (flags gain F_SIDE); len counts body alone."""
    if side:
        flags |= F_SIDE
    h = header(magic, src, dst, comm, tag, seq, len(body), epoch, flags)
    c = crc32c(h + side + body)
    return header(magic, src, dst, comm, tag, seq, len(body), epoch, flags, checksum=c) + side + body


def hello(magic, frm, to, nranks, status=0):
    b = struct.pack("<IHHiii", magic, VERSION, status, frm, to, nranks)
    return b + struct.pack("<I", crc32c(b))


def data(seq, payload, tag=5, comm=1):
    return frame(MAGIC_DATA, payload, comm=comm, tag=tag, seq=seq)


TF_CONFIGS = [
    "",
    "{}",
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]},'
    ' "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"}',
    '{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},'
    ' "task": {"type": "evaluator", "index": 0}}',
    '{"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}}',
    '{"cluster": {"worker": ["[::1]:2222", "[fe80::1]:2223"]}, "task": {"type": "worker",'
    ' "index": "1"}, "environment": "cloud"}',
    '{"cluster": {"worker": ["w:1"], "ps": ["p0:1", "p1:1"]}, "task": {"type": "ps", "index": 1}}',
    '{"cluster": {"worker": {"1": "w:1"}}, "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"worker": ["w:1", "w:1"]}, "task": {"type": "worker", "index": 0}}',
    '{"task": {"type": "worker", "index": 0}, "task": {"type": "chief", "index": 0}}',
    '{"cluster": {"worker": ["w:65536"]}, "task": {"type": "worker", "index": 0}}',
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "seeds")
    tf = os.path.join(out, "tf_config")
    tcp = os.path.join(out, "tcp_frames")
    os.makedirs(tf, exist_ok=True)
    os.makedirs(tcp, exist_ok=True)
    for i, t in enumerate(TF_CONFIGS):
        with open(os.path.join(tf, "%02d.json" % i), "wb") as f:
            f.write(bytes([0x30 + i % 4]) + t.encode())

    wrapped_inner = header(MAGIC_DATA, 0, 1, 1, 9, 1, 4, flags=0) + b"abcd"  # as inproc writes it
    abort_body = struct.pack("<i", 0) + b"peer 0 went away"
    withdrawn = header(MAGIC_DATA, 0, 1, 1, 5, 2, 16)
    seeds = {
        # in: rank 0 talks to rank 1
        "in_data": b"\x00" + data(1, b"12345678") + data(2, b"abcdefgh" * 4, tag=6),
        "in_two_comms": b"\x00" + data(1, b"x" * 16) + data(1, b"y" * 16, comm=16),
        "in_gap": b"\x00" + data(1, b"first") + data(3, b"third"),
        "in_side": b"\x00" + frame(MAGIC_DATA, b"payload!", tag=5, seq=1, side=bytes(range(32)))
        + frame(MAGIC_DATA, b"", tag=6, seq=2, side=b"\xff" * 32) + data(3, b"plain"),
        "in_unknown_flag": b"\x00" + frame(MAGIC_DATA, b"abcd", tag=5, seq=1, flags=F_CHECKSUM | 0x40),
        "in_old_version": b"\x02" + struct.pack("<IHHiiIIIIQQ", MAGIC_DATA, 1, F_CHECKSUM, 0, 1,
                                                 1, 0, 5, 0, 1, 4) + b"abcd",
        "in_wrapped": b"\x00" + frame(MAGIC_RAW, wrapped_inner),
        "in_abort": b"\x00" + data(1, b"before") + frame(MAGIC_CTL, abort_body, tag=1),
        "in_withdrawn": b"\x00" + data(1, b"one") + frame(MAGIC_CTL, withdrawn, tag=2)
        + data(3, b"three"),
        "in_hello_given": b"\x04" + hello(HELLO, 0, 1, 2) + data(1, b"hello"),
        "in_hello_wrong_rank": b"\x04" + hello(HELLO, 0, 0, 2) + data(1, b"x"),
        "in_bad_checksum": b"\x02" + header(MAGIC_DATA, 0, 1, 1, 5, 1, 4) + b"abcd",
        "in_truncated": b"\x00" + data(1, b"z" * 64)[:80],
        # empty bodies, where the frames before them leave the read position
        # on and off a 16-byte boundary, of every kind of frame
        "in_empty": b"\x00" + data(1, b"") + data(2, b"abc") + data(3, b"")
        + frame(MAGIC_CTL, b"", tag=7) + data(4, b"x" * 13) + frame(MAGIC_CTL, b"", tag=1)
        + data(5, b""),
        "in_empty_wrapped": b"\x00" + data(1, b"q") + frame(MAGIC_RAW, header(
            MAGIC_DATA, 0, 1, 1, 9, 2, 0, flags=0)) + frame(MAGIC_RAW, b""),
        "in_empty_side": b"\x00" + data(1, b"ab") + frame(MAGIC_DATA, b"", tag=6, seq=2,
                                                             side=b"\x01" * 32) + data(3, b""),
        "out_empty": b"\x01" + frame(MAGIC_CTL, b"x", dst=0, tag=9)
        + frame(MAGIC_CTL, b"", dst=0, tag=9) + frame(MAGIC_CTL, b"", dst=0, tag=1),
        # out: rank 1 connects to rank 0, which answers
        "out_abort": b"\x01" + frame(MAGIC_CTL, abort_body, dst=0, tag=1),
        "out_refused": b"\x05" + hello(ACK, 0, 1, 2, status=3),
        "out_data_back": b"\x01" + data(1, b"not allowed this way"),
    }
    for name, blob in seeds.items():
        with open(os.path.join(tcp, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
