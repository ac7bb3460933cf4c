"""How much programmatic dependent launch (PDL) saves between dependent kernels of a CUDA graph (Hopper).

A decoding step is a chain of small dependent kernels, so the gaps between them count as much as the kernels.
This times a chain of tiny Triton kernels, each reading what the previous one wrote, captured in a CUDA graph:
plain launches against PDL launches (``launch_pdl=True``; each kernel waits on its predecessor with
``griddepcontrol.wait`` and lets its own dependents launch at once), both as a straight chain and inside a
conditional WHILE node (the shape of the decoders' loops).

    python benchmarks/bench_pdl.py [--kernels 64] [--programs 8] [--iterations 50] [--body-kernels 8]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from nemo_fastdecode.graphs.while_loop import captured_while_loop


@triton.jit
def _chain_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # the predecessor's writes are visible past this point
        tl.extra.cuda.gdc_launch_dependents()
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x * 0.5 + 1.0, mask=mask)


@triton.jit
def _countdown_kernel(counter_ptr, flag_ptr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    left = tl.load(counter_ptr) - 1
    tl.store(counter_ptr, left)
    tl.store(flag_ptr, left > 0)


def _chain(buffers, kernels: int, programs: int, block: int, pdl: bool) -> None:
    n = buffers[0].numel()
    for k in range(kernels):
        x, y = buffers[k % 2], buffers[(k + 1) % 2]
        _chain_kernel[(programs,)](x, y, n, BLOCK=block, USE_GDC=pdl, launch_pdl=pdl)


def _time_graph(graph: torch.cuda.CUDAGraph, before=None, repeats: int = 50) -> float:
    """Median milliseconds of one replay."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(kernels: int, programs: int, iterations: int, body_kernels: int, block: int = 1024) -> dict:
    device = torch.device("cuda")
    buffers = [torch.zeros(programs * block, device=device) for _ in range(2)]
    counter = torch.zeros([], dtype=torch.int32, device=device)
    flag = torch.zeros([], dtype=torch.bool, device=device)
    rows = {}
    for pdl in (False, True):
        stream = torch.cuda.Stream()
        _chain(buffers, kernels, programs, block, pdl)  # compile outside capture
        _countdown_kernel[(1,)](counter, flag, USE_GDC=pdl, launch_pdl=pdl)
        torch.cuda.synchronize()
        straight = torch.cuda.CUDAGraph()
        with torch.cuda.graph(straight, stream=stream):
            _chain(buffers, kernels, programs, block, pdl)
        looped = torch.cuda.CUDAGraph()
        with torch.cuda.graph(looped, stream=stream), captured_while_loop(flag):
            _chain(buffers, body_kernels, programs, block, pdl)
            _countdown_kernel[(1,)](counter, flag, USE_GDC=pdl, launch_pdl=pdl)

        def reset_loop():
            counter.fill_(iterations)
            flag.fill_(True)

        # the same arithmetic either way: the chain's result must not depend on PDL
        buffers[0].fill_(1.0)
        straight.replay()
        torch.cuda.synchronize()
        result = buffers[kernels % 2].clone()
        straight_ms = _time_graph(straight)
        loop_ms = _time_graph(looped, reset_loop)
        name = "pdl" if pdl else "plain"
        rows[name] = {
            "straight_us_per_kernel": 1000 * straight_ms / kernels,
            "while_us_per_iteration": 1000 * loop_ms / iterations,
            "while_body_kernels": body_kernels + 1,
            "checksum": float(result.sum()),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=64)
    parser.add_argument("--programs", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--body-kernels", type=int, default=8, help="chain kernels per WHILE iteration")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__}
    print(f"{results['device']}, triton {results['triton']}, torch {results['torch']}")
    print("| programs | launch | straight chain, us per kernel | WHILE loop, us per iteration (body kernels) |")
    print("|---|---|---|---|")
    for programs in args.programs:
        rows = measure(args.kernels, programs, args.iterations, args.body_kernels)
        results[str(programs)] = rows
        for name, row in rows.items():
            print(
                f"| {programs} | {name} | {row['straight_us_per_kernel']:.2f} | "
                f"{row['while_us_per_iteration']:.2f} ({row['while_body_kernels']}) |"
            )
        if rows["plain"]["checksum"] != rows["pdl"]["checksum"]:
            raise RuntimeError(f"PDL changed the chain's result: {rows}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
