#!/usr/bin/env python3
"""NCCL's own all-reduce time at the sizes a tensor-parallel decode step sends: the reference for fathom's per-step
collective time (bench/multi_gpu.sh, issue runs 2 and 3). One process per GPU (torch.multiprocessing), PyTorch's
NCCL process group, NVLink multicast off as the lent machines require; each size timed over `--iters` all-reduces in
a row (CUDA events, after warm-up), the median of 5 such runs. Prints one JSON line per (ranks, dtype, bytes).

  python3 bench/nccl_allreduce.py --ranks 2,4 --elements 4096,8192,262144,1048576 --dtypes float32,bfloat16

Runs on the GPU machine (PyTorch with CUDA); needs at least max(--ranks) GPUs.
"""

import argparse
import json
import os
import statistics


def worker(rank, world, args, port, queue):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for n in (int(x) for x in args.elements.split(",")):
            buf = torch.ones(n, dtype=dtype, device="cuda")
            for _ in range(20):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            runs = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    dist.all_reduce(buf)
                end.record()
                torch.cuda.synchronize()
                runs.append(start.elapsed_time(end) * 1e3 / args.iters)  # microseconds per all-reduce
            if rank == 0:
                queue.put({"ranks": world, "dtype": dtype_name, "elements": n,
                           "bytes": n * buf.element_size(), "us_median": statistics.median(runs),
                           "us_runs": runs})
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--elements", default="4096,8192,262144,1048576")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    have = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    for k, world in enumerate(int(x) for x in args.ranks.split(",")):
        if world > have:
            print(json.dumps({"ranks": world, "skipped": f"{have} GPUs"}), flush=True)
            continue
        queue = ctx.Queue()
        port = 29500 + k
        procs = [ctx.Process(target=worker, args=(r, world, args, port, queue)) for r in range(world)]
        for p in procs:
            p.start()
        expected = len(args.dtypes.split(",")) * len(args.elements.split(","))
        for _ in range(expected):  # before the joins: a queue's feeder must drain first
            print(json.dumps(queue.get(timeout=600)), flush=True)
        for p in procs:
            p.join()


if __name__ == "__main__":
    main()
