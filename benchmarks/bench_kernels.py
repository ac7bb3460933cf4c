#!/usr/bin/env python
"""Kernel microbenchmarks: each Triton kernel against the PyTorch a user would write, eager and torch.compile'd.

Needs CUDA (prints a message and exits 0 without it). Times are ``triton.testing.do_bench`` medians with 20/80 %
quantiles; bandwidth is bytes moved over time, set against a measured device-to-device copy.

    python benchmarks/bench_kernels.py --out beam_topk.json --md beam_topk.md
    python benchmarks/bench_kernels.py --only beam_topk --k 4 --n 1,32,1024 --dtype bfloat16

To add a kernel: write ``bench_<name>(args, env) -> BenchResult`` and register it in ``BENCHMARKS``; the
command line, JSON and Markdown handling are shared.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTILES = [0.5, 0.2, 0.8]
DEVICE = "cuda"  # a module global so that a CPU smoke test (Triton interpreter, stubbed timer) can swap it


@dataclass
class Env:
    """Facts shared by every benchmark of one run."""

    gpu: str
    command: str
    torch_version: str
    triton_version: str
    cuda_version: str | None
    copy_bytes_per_s: float


@dataclass
class BenchResult:
    """One benchmark's table: ``columns`` maps row keys to Markdown headers, in order."""

    name: str
    title: str
    config: dict
    columns: dict[str, str]
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def parse_int_list(text: str) -> list[int]:
    """'1,2,4' or '2..8' (inclusive) or a mix: '1,4..6' -> [1, 4, 5, 6]."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ".." in part:
            lo, hi = (int(p) for p in part.split(".."))
            values.extend(range(lo, hi + 1))
        elif part:
            values.append(int(part))
    if not values:
        raise argparse.ArgumentTypeError(f"expected a list like '1,2,4' or '2..8', got {text!r}")
    return values


def time_ms(fn: Callable[[], object], args: argparse.Namespace) -> tuple[float, float, float]:
    """(median, p20, p80) milliseconds."""
    import triton.testing

    if args.cudagraph:  # replay a CUDA graph of the call: GPU time without the host's launch overhead
        median, p20, p80 = triton.testing.do_bench_cudagraph(fn, rep=args.rep, quantiles=QUANTILES)
    else:
        median, p20, p80 = triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, quantiles=QUANTILES)
    return median, p20, p80


def measure_copy_bandwidth(args: argparse.Namespace) -> float:
    """Device-to-device copy of a 512 MiB buffer: bytes read + written per second (the practical HBM ceiling)."""
    n_bytes = 512 * 2**20
    src = torch.empty(n_bytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    median, _, _ = time_ms(lambda: dst.copy_(src), args)
    return 2 * n_bytes / (median * 1e-3)


# --- beam_topk ------------------------------------------------------------------------------------------------------


def torch_beam_step(
    logits: torch.Tensor, k: int, blank_index: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched PyTorch beam step as a user would write it: log_softmax, top-k with blank masked out, blank appended.
    ``blank_index`` is a 1-element int64 tensor on the logits' device (made once, outside the timed region)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    blank = logp.index_select(1, blank_index)
    top_values, top_ids = logp.index_fill(1, blank_index, float("-inf")).topk(k, dim=-1)
    return torch.cat((top_values, blank), dim=1), torch.cat((top_ids, blank_index.expand(logp.shape[0], 1)), dim=1)


def bench_beam_topk(args: argparse.Namespace, env: Env) -> BenchResult:
    from nemo_fastdecode.kernels import beam_topk

    dtype = DTYPES[args.dtype]
    v = args.vocab
    blank_id = v - 1 if args.blank_id is None else args.blank_id
    blank_index = torch.tensor([blank_id], device=DEVICE)
    elem = torch.empty((), dtype=dtype).element_size()
    compiled_steps: dict[int, Callable] = {}
    result = BenchResult(
        name="beam_topk",
        title=f"beam_topk: V={v}, {args.dtype}, temperature {args.temperature}, blank_id {blank_id}",
        config={
            "vocab": v,
            "dtype": args.dtype,
            "temperature": args.temperature,
            "blank_id": blank_id,
            "k": args.k,
            "n": args.n,
            "compile_mode": None if args.no_compile else args.compile_mode,
            "num_warps": args.num_warps,
        },
        columns={
            "k": "k",
            "n": "N",
            "triton_us": "Triton us",
            "torch_us": "PyTorch us",
            "compile_us": "compile us",
            "speedup_vs_torch": "x PyTorch",
            "speedup_vs_compile": "x compile",
            "triton_GBps": "Triton GB/s",
            "pct_of_copy": "% copy BW",
        },
    )
    if not args.no_compile:
        import torch._dynamo as dynamo

        # One static-shape graph per (N, k): the best case for torch.compile, so raise the recompile limit.
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, 4096)
        result.notes.append(
            f"torch.compile(mode={args.compile_mode!r}, dynamic=False): one static graph per shape, compile time "
            "excluded."
        )
    for k in args.k:
        for n in args.n:
            logits = torch.randn(n, v, device=DEVICE).to(dtype)
            row = {"k": k, "n": n}

            def run_triton(logits=logits, k=k):
                if args.num_warps is None:  # the public entry point, argument checks included, as callers pay them
                    return beam_topk.log_softmax_topk(logits, k, blank_id, args.temperature)
                return beam_topk.launch_log_softmax_topk(
                    logits, k, blank_id, args.temperature, num_warps=args.num_warps
                )

            def run_torch(logits=logits, k=k):
                return torch_beam_step(logits, k, blank_index, args.temperature)

            # Correctness first: ids exactly as the reference, values as PyTorch's log_softmax.
            got_values, got_ids = run_triton()
            ref_values, ref_ids = beam_topk.log_softmax_topk_reference(logits, k, blank_id, args.temperature)
            torch_values, _ = run_torch()
            row["ids_match_reference"] = bool(torch.equal(got_ids, ref_ids))
            row["max_abs_diff_vs_torch"] = float((got_values - torch_values).abs().max())

            row["triton_ms"] = time_ms(run_triton, args)
            row["torch_ms"] = time_ms(run_torch, args)
            row["compile_ms"] = None
            if not args.no_compile:
                try:
                    if k not in compiled_steps:
                        compiled_steps[k] = torch.compile(torch_beam_step, mode=args.compile_mode, dynamic=False)
                    step = compiled_steps[k]
                    step(logits, k, blank_index, args.temperature)  # compile outside the timed region
                    row["compile_ms"] = time_ms(
                        lambda s=step, x=logits, k=k: s(x, k, blank_index, args.temperature), args
                    )
                except Exception as exc:  # report and go on: the other providers are still worth having
                    row["compile_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                    print(f"[beam_topk] torch.compile failed for k={k} N={n}: {row['compile_error']}", file=sys.stderr)

            t = row["triton_ms"][0]
            n_bytes = n * v * elem + n * (k + 1) * (4 + 8)  # logits read + values (fp32) and ids (int64) written
            row["bytes"] = n_bytes
            row["triton_us"] = 1e3 * t
            row["torch_us"] = 1e3 * row["torch_ms"][0]
            row["compile_us"] = None if row["compile_ms"] is None else 1e3 * row["compile_ms"][0]
            row["speedup_vs_torch"] = row["torch_ms"][0] / t
            row["speedup_vs_compile"] = None if row["compile_ms"] is None else row["compile_ms"][0] / t
            row["triton_GBps"] = n_bytes / (t * 1e-3) / 1e9
            row["pct_of_copy"] = 100 * (n_bytes / (t * 1e-3)) / env.copy_bytes_per_s
            result.rows.append(row)
            print(
                f"[beam_topk] k={k:2d} N={n:5d}  triton {row['triton_us']:8.1f} us  torch {row['torch_us']:8.1f} us"
                f"  compile {_fmt(row['compile_us'])} us  ids_ok={row['ids_match_reference']}",
                flush=True,
            )
    failed = [r for r in result.rows if "compile_error" in r]
    if failed:
        result.notes.append(
            f"torch.compile failed for (k, N) = {[(r['k'], r['n']) for r in failed]}: {failed[0]['compile_error']}"
        )
    bad = [(r["k"], r["n"]) for r in result.rows if not r["ids_match_reference"]]
    if bad:
        result.notes.append(f"ids differ from the reference for (k, N) = {bad}")
    large = [r for r in result.rows if r["n"] >= args.large_n]
    if large:
        best = max(large, key=lambda r: r["triton_GBps"])
        result.notes.append(
            f"N >= {args.large_n}: Triton reaches up to {best['triton_GBps']:.0f} GB/s "
            f"({best['pct_of_copy']:.0f} % of the copy bandwidth) at k={best['k']}, N={best['n']}."
        )
    return result


BENCHMARKS: dict[str, Callable[[argparse.Namespace, Env], BenchResult]] = {
    "beam_topk": bench_beam_topk,
}


# --- output ---------------------------------------------------------------------------------------------------------


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def to_markdown(env: Env, results: list[BenchResult]) -> str:
    lines = [
        "# Kernel microbenchmarks",
        "",
        f"- GPU: {env.gpu}",
        f"- Command: `{env.command}`",
        f"- torch {env.torch_version}, triton {env.triton_version}, CUDA {env.cuda_version}",
        f"- Device-to-device copy bandwidth (read + write): {env.copy_bytes_per_s / 1e9:.0f} GB/s",
        "- Times: `triton.testing.do_bench` median (`do_bench_cudagraph` when the command has --cudagraph); "
        "speed-ups are PyTorch (or compile) time over Triton time.",
    ]
    for result in results:
        lines += ["", f"## {result.title}", ""]
        lines.append("| " + " | ".join(result.columns.values()) + " |")
        lines.append("|" + "---|" * len(result.columns))
        for row in result.rows:
            lines.append("| " + " | ".join(_fmt(row.get(key)) for key in result.columns) + " |")
        if result.notes:
            lines.append("")
            lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(BENCHMARKS),
        default=sorted(BENCHMARKS),
        help="benchmarks to run (default: all)",
    )
    parser.add_argument("--vocab", type=int, default=1025, help="V, blank included (default 1025, Parakeet 1024+1)")
    parser.add_argument("--k", type=parse_int_list, default=parse_int_list("2..8"), help="k values, e.g. 2..8")
    parser.add_argument(
        "--n", type=parse_int_list, default=parse_int_list("1,2,4,8,16,32,64,128,256,512,1024"), help="batch rows"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--blank-id", type=int, default=None, help="default V - 1 (NeMo's blank)")
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    parser.add_argument(
        "--cudagraph", action="store_true", help="time CUDA-graph replays (kernel time, as inside the decoders)"
    )
    parser.add_argument("--num-warps", type=int, default=None, help="override the kernel's warp heuristic")
    parser.add_argument("--large-n", type=int, default=256, help="N from which bandwidth is summarised")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    parser.add_argument("--out", type=Path, default=None, help="write JSON here")
    parser.add_argument("--md", type=Path, default=None, help="write a Markdown table here")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_kernels.py: CUDA is not available; these benchmarks time GPU kernels. Nothing to do.")
        return 0

    import triton

    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    env = Env(
        gpu=torch.cuda.get_device_name(),
        command=command,
        torch_version=torch.__version__,
        triton_version=triton.__version__,
        cuda_version=torch.version.cuda,
        copy_bytes_per_s=measure_copy_bandwidth(args),
    )
    print(f"{env.gpu}: device-to-device copy {env.copy_bytes_per_s / 1e9:.0f} GB/s (read + write)", flush=True)
    results = [BENCHMARKS[name](args, env) for name in args.only]

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"env": asdict(env), "benchmarks": {r.name: asdict(r) for r in results}}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}")
    markdown = to_markdown(env, results)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown)
        print(f"wrote {args.md}")
    else:
        print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
