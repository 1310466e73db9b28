"""What a user would write in PyTorch for one MLA decode step over a contiguous BF16 latent cache,
timed on the same sweep as `metrale bench --sweep`, plus the two roofline ceilings measured in the
same run: device-to-device copy bandwidth and the dense BF16 matrix rate.

    python3 bench/torch_baseline.py OUT.json
    python3 bench/torch_baseline.py OUT.json --rows-from EARLIER.json   # the ceilings only, the
                                                                        # baseline rows of an earlier run

Two baselines per (batch B, context L, heads H), the faster is the baseline:
  sdpa:   F.scaled_dot_product_attention(q [B,H,1,576], k [B,1,L,576], v [B,1,L,512], enable_gqa=True)
  matmul: heads as rows: softmax(q [B,H,576] @ kv[B,L,576]^T · scale) @ kv[B,L,:512]
Times are CUDA-event medians after warm-up; a row whose first run takes over 1 s is timed once;
B=128 × L=64K is left out (about a minute of device time for one row). --timing lone (the
default, and the files before the setting, whose JSON has no "timing") starts each timed run on
an idle stream; flush queues it behind a 256 MiB memset, as triton.testing.do_bench does: the
host's latency to launch each of the baseline's kernels out of the time (on an H100 its rows at
batch ≥ 32 from 4K keys took 0.86–0.97× the lone ones of an earlier call), the memset's dirty
L2 lines written back during the run; blocking holds the stream with a spinning kernel
(torch.cuda._sleep, as nvbench's blocking kernel) while the run's launches queue, checked to
outlast the queueing (doubled and the run timed again when it did not): that latency out of the
time, with no memory traffic.
`metrale bench --sweep --torch` refuses rows timed otherwise than its own --timing.
"""
import argparse
import json
import math
import time


FLUSH = None  # the 256 MiB that --timing flush zeroes ahead of each timed run
HOLD = None  # --timing blocking: {"cycles": the spin's length, "event": recorded ahead of it}
HOLD_CYCLES = 1 << 21  # the spin a row starts from: about 1 ms at 2 GHz


def timed_ms(fn, start, stop):
    while True:
        if FLUSH is not None:
            FLUSH.zero_()  # queued ahead of the start event: the run's launches queue behind it
        if HOLD is not None:
            HOLD["event"].record()
            torch.cuda._sleep(HOLD["cycles"])  # spins on the stream while the run's launches queue
        t0 = time.perf_counter()
        start.record()
        fn()
        stop.record()
        queued_ms = (time.perf_counter() - t0) * 1e3
        stop.synchronize()
        # Held long enough when the spin outlasted the queueing, with a margin for its own launch.
        if HOLD is None or HOLD["event"].elapsed_time(start) > 1.5 * queued_ms + 0.05:
            return start.elapsed_time(stop)
        if HOLD["cycles"] >= 1 << 31:  # about a second: the run waits on its own stream, not on the host
            raise SystemExit(f"torch_baseline.py: --timing blocking: the run took {queued_ms:.1f} ms to queue, "
                             "longer than a spin of 2^31 cycles; it waits on its stream")
        HOLD["cycles"] *= 2


def median_ms(fn, target_s=0.3):
    if HOLD is not None:
        HOLD["cycles"] = HOLD_CYCLES  # each row from the short spin: one slow queueing lengthens only its row
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first = timed_ms(fn, start, stop)
    if first > 1000:  # a second is enough to know a row is slow
        return first
    iters = max(1, min(30, int(target_s * 1e3 / max(first, 1e-3))))
    times = sorted(timed_ms(fn, start, stop) for _ in range(iters))
    return times[len(times) // 2]


def ceilings():
    n = 1 << 30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy_ms = median_ms(lambda: b.copy_(a))
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    mm_ms = median_ms(lambda: x @ y)
    del a, b, x, y
    return 2 * n / (copy_ms * 1e-3) / 1e9, 2 * m**3 / (mm_ms * 1e-3) / 1e12


def main(out_path, rows_from=None, timing="lone"):
    global FLUSH, HOLD
    if rows_from is not None:  # the baseline does not change between metrale builds: reuse its rows
        with open(rows_from) as f:
            earlier = json.load(f)
        if earlier.get("timing", "lone") != timing:
            raise SystemExit(f"torch_baseline.py: {rows_from}'s rows were timed {earlier.get('timing', 'lone')}, "
                             f"not {timing} (--timing)")
    if timing == "flush":
        FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    if timing == "blocking":
        HOLD = {"cycles": HOLD_CYCLES, "event": torch.cuda.Event(enable_timing=True)}
    copy_gbps, matmul_tflops = ceilings()
    # which PyTorch and GPU measured the ceilings and, unless --rows-from, the rows: its kernels
    # (cuBLAS's among them) set the baseline
    where = {"torch_version": torch.__version__, "device": torch.cuda.get_device_name()}
    print(f"copy {copy_gbps:.0f} GB/s, bf16 matmul {matmul_tflops:.0f} TFLOP/s (timing {timing}; "
          f"torch {where['torch_version']} on {where['device']})", flush=True)
    if rows_from is not None:
        with open(out_path, "w") as f:
            # the ceilings are this run's; the rows keep the PyTorch and GPU they were measured on
            rows_where = {"rows_torch_version": earlier.get("torch_version"), "rows_device": earlier.get("device")}
            json.dump({"copy_gbps": copy_gbps, "matmul_tflops": matmul_tflops, "timing": timing, **where,
                       **rows_where, "rows": earlier["rows"], "rows_from": rows_from}, f, indent=1)
        return
    scale = 1 / math.sqrt(192)
    rows = []
    for B in (1, 8, 32, 128):
        for L in (1024, 4096, 16384, 65536):
            if B * L > 32 * 65536:
                continue
            kv = torch.randn(B, L, 576, dtype=torch.bfloat16, device="cuda")
            for H in (16, 64, 128):
                q = torch.randn(B, H, 576, dtype=torch.bfloat16, device="cuda")

                def sdpa():
                    return F.scaled_dot_product_attention(
                        q.unsqueeze(2), kv.unsqueeze(1), kv[..., :512].unsqueeze(1), scale=scale, enable_gqa=True)

                def matmul():
                    s = torch.matmul(q, kv.transpose(1, 2)) * scale
                    return torch.matmul(torch.softmax(s.float(), dim=-1).to(torch.bfloat16), kv[..., :512])

                row = {"B": B, "L": L, "H": H}
                for name, fn in (("sdpa", sdpa), ("matmul", matmul)):
                    try:
                        row[name + "_us"] = median_ms(fn) * 1e3
                    except torch.OutOfMemoryError:
                        row[name + "_us"] = None
                        torch.cuda.empty_cache()
                times = [t for t in (row["sdpa_us"], row["matmul_us"]) if t is not None]
                row["best_us"] = min(times) if times else None
                rows.append(row)
                print(row, flush=True)
                del q
            del kv
            torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"copy_gbps": copy_gbps, "matmul_tflops": matmul_tflops, "timing": timing, **where, "rows": rows},
                  f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="The PyTorch baseline of an MLA decode step and the two roofline ceilings (copy GB/s, "
        "BF16 matmul TFLOP/s), measured on the GPU and written as JSON for `metrale bench --sweep --torch`. "
        "Needs PyTorch with a CUDA GPU.")
    parser.add_argument("out", metavar="OUT.json", help="where the ceilings and the baseline rows go")
    parser.add_argument("--rows-from", metavar="EARLIER.json",
                        help="measure the ceilings only and take the baseline rows from an earlier run's file")
    parser.add_argument("--timing", choices=("lone", "flush", "blocking"), default="lone",
                        help="lone (the default): each timed run on an idle stream; flush: queued behind a 256 MiB "
                        "memset, as triton.testing.do_bench; blocking: its stream held by a spinning kernel while "
                        "its launches queue, as nvbench")
    args = parser.parse_args()
    try:  # after the arguments: --help and a usage error need neither torch nor a GPU
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        raise SystemExit(f"torch_baseline.py needs PyTorch with CUDA (pip install torch on the GPU machine): {e}")
    if not torch.cuda.is_available():
        raise SystemExit("torch_baseline.py needs a CUDA GPU: torch.cuda.is_available() is False")
    main(args.out, args.rows_from, args.timing)
