#!/usr/bin/env python3
"""The PyTorch side of the comparison: times torch.distributed's all-reduce
with the gloo backend (tcp on loopback), one process per rank, with the
flags, inputs, check and columns of `dsim bench`, `mpi_bench` and
`gloo_bench` (sim/bench/bench_common.c):

  torch_bench.py [allreduce] [--ranks 4] -b 4K -e 64M -f 4 -n 20 -w 5

float32 sum only. Each rank is a process of its own (spawned, so that no
thread of the parent's crosses a fork); they meet through a FileStore in a
fresh temporary directory, as gloo_bench does. PyTorch reduces in place, so
the timed iterations reduce what the one before left (the values grow; the
time does not care), and one more from the input, untimed, is the one
checked. Each rank runs one intra-op thread, as every other contestant
does. Exit status: 0, 1 if an output was wrong or a rank failed, 2 for bad
flags, 77 where PyTorch or its gloo backend is missing (Debian:
python3-torch).
"""
import ctypes
import mmap
import os
import re
import sys
import tempfile
import time

USAGE = ("usage: torch_bench.py [allreduce] [--ranks N] [-b SIZE] [-e SIZE] [-f FACTOR] "
         "[-n ITERS] [-w WARMUP] [-c 0|1]")


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        raise ValueError(f"bad size {s!r}: a number with an optional K, M or G suffix")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def parse(argv):
    o = {"ranks": 4, "b": 4 << 10, "e": 64 << 20, "f": 2, "n": 20, "w": 5, "c": 1}
    args = list(argv)
    if args and args[0] == "allreduce":
        args.pop(0)
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        key = {"--ranks": "ranks", "-b": "b", "-e": "e", "-f": "f", "-n": "n", "-w": "w",
               "-c": "c"}.get(a)
        if key is None or not args:
            raise ValueError(f"unknown flag {a!r} or a flag without its value")
        v = args.pop(0)
        o[key] = parse_size(v) if key in ("b", "e") else int(v)
    if not (2 <= o["ranks"] <= 64 and 4 <= o["b"] <= o["e"] and o["f"] >= 2 and o["n"] >= 1
            and o["w"] >= 0):
        raise ValueError("--ranks 2..64, 4 <= -b <= -e, -f >= 2, -n >= 1, -w >= 0")
    return o


def sizes(o):
    s = o["b"]
    while s <= o["e"]:
        yield s
        s *= o["f"]


def input_values(torch, n, rank, count):
    """bench_common.c's sum input: ((i + 3 rank) mod 2m+1) - m, m = 3 (at most
    2^24 / n), exact in float32."""
    m = max(1, min(3, 16777216 // n))
    i = torch.arange(count, dtype=torch.int64)
    return (((i + 3 * rank) % (2 * m + 1)) - m).to(torch.float32)


def buf_like(torch, t):
    """A copy of t in memory allocated as dsim allocates its buffers (from 2
    MiB up: 2 MiB aligned, advised as transparent huge pages), so that every
    contestant's buffers are alike; PyTorch's own CPU allocator has no such
    option in this version."""
    huge = 2 << 20
    nbytes = t.numel() * t.element_size()
    if nbytes < huge or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t.clone()
    m = mmap.mmap(-1, nbytes + huge)
    off = (-ctypes.addressof(ctypes.c_char.from_buffer(m))) % huge
    m.madvise(mmap.MADV_HUGEPAGE, off, nbytes // huge * huge)
    buf = torch.frombuffer(m, dtype=t.dtype, count=t.numel(), offset=off)
    buf.copy_(t)
    _keep.append(m)
    return buf


_keep = []  # the mappings under buf_like's tensors, kept to the end


def expected_values(torch, n, count):
    """The exact sum of every rank's input (small integers: no rounding)."""
    return sum(input_values(torch, n, r, count) for r in range(n))


def rank_main(rank, o, store, q):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        n = o["ranks"]
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=n)
        wrong_total, busbw_sum, rows = 0, 0.0, 0
        if rank == 0:
            print(f"# torch_bench allreduce: {n} ranks as processes ({os.cpu_count()} CPUs "
                  f"online), torch.distributed gloo backend over tcp (127.0.0.1), PyTorch "
                  f"{torch.__version__}")
            print(f"# minBytes {o['b']} maxBytes {o['e']} step: {o['f']}(factor) warmup iters: "
                  f"{o['w']} iters: {o['n']} validation: {o['c']}")
            print("# time: the slowest rank's average per iteration; each rank times its -n "
                  "iterations from a barrier after the -w warm-ups (in place: a last, untimed "
                  "call from the input is the one checked)")
            print("#")
            print("#       size         count      type   redop       time     algbw     busbw"
                  "  #wrong")
            print("#        (B)    (elements)                         (us)    (GB/s)    (GB/s)")
        for size in sizes(o):
            count = size // 4
            if count == 0:
                continue
            inp = input_values(torch, n, rank, count)
            buf = buf_like(torch, inp)
            for _ in range(o["w"]):
                dist.all_reduce(buf)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(o["n"]):
                dist.all_reduce(buf)
            spent = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(spent, op=dist.ReduceOp.MAX)
            buf.copy_(inp)
            dist.all_reduce(buf)
            w = 0
            if o["c"]:
                w = int((buf != expected_values(torch, n, count)).sum())
            wt = torch.tensor([w], dtype=torch.int64)
            dist.all_reduce(wt)
            wrong = int(wt[0])
            wrong_total += wrong
            secs = float(spent[0]) / o["n"]
            algbw = count * 4 / secs / 1e9
            busbw = algbw * 2 * (n - 1) / n
            busbw_sum += busbw
            rows += 1
            if rank == 0:
                print(f"{count * 4:12d} {count:14d} {'float':>9s} {'sum':>7s} "
                      f"{secs * 1e6:10.2f} {algbw:9.2f} {busbw:9.2f} {wrong:7d}", flush=True)
        if rank == 0:
            print(f"# Out of bounds values : {wrong_total} {'OK' if not wrong_total else 'FAILED'}")
            print(f"# Avg bus bandwidth    : {busbw_sum / rows if rows else 0.0:.3f}")
            sys.stdout.flush()
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, 1 if wrong_total else 0, ""))
    except Exception as e:  # a rank's failure is reported, not a hang
        q.put((rank, 1, f"{type(e).__name__}: {e}"))


def main(argv):
    try:
        o = parse(argv)
    except ValueError as e:
        print(f"torch_bench: {e}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed has no gloo backend")
    except ImportError as e:
        print(f"torch_bench: PyTorch with its gloo backend is not here ({e}); on Debian: "
              "apt-get install python3-torch", file=sys.stderr)
        return 77
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="torch_bench.") as d:
        q = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, o, os.path.join(d, "store"), q))
                 for r in range(o["ranks"])]
        for p in procs:
            p.start()
        status, said = 0, []
        deadline = time.time() + 1800
        for _ in procs:
            try:
                rank, rc, msg = q.get(timeout=max(1.0, deadline - time.time()))
            except Exception:
                said.append("a rank gave no result within the time limit")
                status = 1
                break
            if rc:
                status = 1
                if msg:
                    said.append(f"rank {rank}: {msg}")
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
            elif p.exitcode:
                status = 1
        for m in said:
            print(f"torch_bench: {m}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
