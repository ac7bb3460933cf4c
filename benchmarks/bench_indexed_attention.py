"""Microbenchmark: fused indexed attention vs gather + masked SDPA over a pre-allocated slot cache.

A fixed cache of S slots ([S, H, T, D] keys and values) serves N active streams; every stream has the
same length, swept from small to full as a fraction of T (``--ragged``: lengths drawn uniformly up to
it). Providers, timed with ``triton.testing.do_bench`` (median, 20th and 80th percentiles):

- ``triton``: ``indexed_attention`` reads the slots in place and stops at each stream's length.
- ``torch``: what NeMo-style code does: ``index_select`` the N slots (a copy of the full T frames),
  build a mask from the lengths, ``scaled_dot_product_attention`` over all T keys (with ``--rel-pos``:
  ``(q + v) @ p^T`` over all 2T-1 positions, a gather standing for ``rel_shift``, and the positional
  term passed to SDPA as a float mask, like NeMo's ``use_pytorch_sdpa`` path).

Example::

    python benchmarks/bench_indexed_attention.py --cache-len 86 512 --streams 16 64 256 \\
        --out benchmarks/results/indexed_attention_H100_2025-01-01.json --md ....md --plot ....png
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=1024, help="S, slots in the cache")
    parser.add_argument("--heads", type=int, default=8, help="H")
    parser.add_argument("--head-dim", type=int, default=64, help="D")
    parser.add_argument(
        "--cache-len", type=int, nargs="+", default=[86, 512], help="T values (86 = 70 left + 16 chunk)"
    )
    parser.add_argument("--chunk", type=int, default=16, help="Tq, query frames per stream and step")
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 64, 256], help="N active streams")
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.0, 0.125, 0.25, 0.5, 0.75, 1.0],
        help="stream length as a fraction of T (clamped to [Tq, T])",
    )
    parser.add_argument("--ragged", action="store_true", help="lengths uniform in [Tq, fraction * T] per stream")
    parser.add_argument("--rel-pos", action="store_true", help="include the FastConformer relative-position term")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cudagraph", action="store_true", help="time CUDA-graph replays (kernel time, as inside the encoder graph)"
    )
    parser.add_argument("--out", type=Path, help="write JSON results here")
    parser.add_argument("--md", type=Path, help="write a Markdown table here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot of latency vs length here (needs matplotlib)")
    return parser.parse_args(argv)


def torch_gather_sdpa(q, k_cache, v_cache, slot_ids, lengths, scale, bias_u=None, bias_v=None, pos=None):
    """The baseline: copy the N slots out, mask by length, SDPA over all T keys (native dtype)."""
    n, h, tq, d = q.shape
    t = k_cache.shape[2]
    k = k_cache.index_select(0, slot_ids)
    v = v_cache.index_select(0, slot_ids)
    key_pos = torch.arange(t, device=q.device)
    valid = (key_pos[None, :] < lengths[:, None]).view(n, 1, 1, t)
    if pos is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=valid, scale=scale)
    num_rows = pos.shape[1]
    bd_full = (q + bias_v[None, :, None, :]) @ pos.transpose(-2, -1)[None]  # [N, H, Tq, P]
    qpos = lengths[:, None] - tq + torch.arange(tq, device=q.device)[None, :]
    rows = ((num_rows - 1) // 2 - qpos[:, :, None] + key_pos[None, None, :]).clamp(0, num_rows - 1)
    bd = torch.gather(bd_full, 3, rows[:, None].expand(n, h, tq, t)) * scale
    bias = bd.masked_fill(~valid, float("-inf"))
    return F.scaled_dot_product_attention(q + bias_u[None, :, None, :], k, v, attn_mask=bias, scale=scale)


def measure_copy_bandwidth(do_bench, device):
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=50)
    return 2 * src.numel() / (ms * 1e-3) / 1e9  # read + write, GB/s


def run(args, device="cuda"):
    from triton.testing import do_bench, do_bench_cudagraph

    from nemo_fastdecode.kernels.indexed_attention import indexed_attention

    device = torch.device(device)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    h, d, s, tq = args.heads, args.head_dim, args.slots, args.chunk
    scale = 1.0 / math.sqrt(d)
    elem = torch.finfo(dtype).bits // 8
    rows = []
    copy_gbps = measure_copy_bandwidth(do_bench, device)
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s", flush=True)

    for t in args.cache_len:
        if tq > t:
            print(f"skip T={t}: chunk Tq={tq} does not fit", flush=True)
            continue
        k_cache = torch.randn(s, h, t, d, generator=g).to(device, dtype)
        v_cache = torch.randn(s, h, t, d, generator=g).to(device, dtype)
        extra = {}
        if args.rel_pos:
            extra = {
                "pos_bias_u": torch.randn(h, d, generator=g).to(device, dtype),
                "pos_bias_v": torch.randn(h, d, generator=g).to(device, dtype),
                "pos_emb": torch.randn(h, 2 * t - 1, d, generator=g).to(device, dtype),
            }
        for n in args.streams:
            if n > s:
                print(f"skip N={n}: more streams than S={s} slots", flush=True)
                continue
            q = torch.randn(n, h, tq, d, generator=g).to(device, dtype)
            slot_ids = torch.randperm(s, generator=g)[:n].to(device)
            for frac in args.fractions:
                top = min(t, max(tq, round(frac * t)))
                high = torch.randint(tq, top + 1, (n,), generator=g) if args.ragged else torch.full((n,), top)
                lengths = high.to(device)
                mean_len = float(lengths.float().mean())

                def triton_fn(q=q, k=k_cache, v=v_cache, ids=slot_ids, lens=lengths, extra=extra):
                    return indexed_attention(q, k, v, ids, lens, scale, check_values=False, use_triton=True, **extra)

                def torch_fn(q=q, k=k_cache, v=v_cache, ids=slot_ids, lens=lengths, extra=extra):
                    return torch_gather_sdpa(
                        q,
                        k,
                        v,
                        ids,
                        lens,
                        scale,
                        extra.get("pos_bias_u"),
                        extra.get("pos_bias_v"),
                        extra.get("pos_emb"),
                    )

                max_diff = (triton_fn().float() - torch_fn().float()).abs().max().item()
                # Bytes the fused kernel must read: K and V up to each stream's length (plus q, out).
                kv_bytes = 2 * h * d * elem * float(lengths.sum()) + 2 * q.numel() * elem
                for provider, fn in (("triton", triton_fn), ("torch", torch_fn)):
                    if args.cudagraph:  # kernel time without the host's launch overhead, as in the encoder graph
                        med, p20, p80 = do_bench_cudagraph(fn, rep=args.rep, quantiles=[0.5, 0.2, 0.8])
                    else:
                        med, p20, p80 = do_bench(fn, warmup=args.warmup, rep=args.rep, quantiles=[0.5, 0.2, 0.8])
                    row = {
                        "T": t,
                        "N": n,
                        "fraction": frac,
                        "max_length": top,
                        "mean_length": mean_len,
                        "provider": provider,
                        "ms": med,
                        "ms_p20": p20,
                        "ms_p80": p80,
                        "useful_kv_GBps": kv_bytes / (med * 1e-3) / 1e9,
                        "max_abs_diff": max_diff,
                    }
                    rows.append(row)
                    print(
                        f"T={t:4d} N={n:4d} len={mean_len:6.1f} {provider:6s} {med * 1e3:9.1f} us "
                        f"{row['useful_kv_GBps']:7.1f} GB/s  max|diff|={max_diff:.2e}",
                        flush=True,
                    )
        del k_cache, v_cache
        torch.cuda.empty_cache()
    return rows, copy_gbps


def to_markdown(rows, meta):
    lines = [
        "# Indexed attention: fused Triton kernel vs gather + masked SDPA",
        "",
        f"- GPU: {meta['gpu']}; torch {meta['torch']}, triton {meta['triton']}; dtype {meta['dtype']}",
        f"- S={meta['slots']} slots, H={meta['heads']}, D={meta['head_dim']}, Tq={meta['chunk']}, "
        f"relative position: {meta['rel_pos']}, ragged lengths: {meta['ragged']}",
        f"- measured copy bandwidth: {meta['copy_GBps']:.0f} GB/s; medians of `triton.testing.{meta['timer']}`",
        f"- command: `{meta['command']}`",
        "",
        "| T | N | max length | mean length | triton (us) | torch (us) | speed-up | triton useful K/V GB/s | max abs diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {}
    for row in rows:
        by_key.setdefault((row["T"], row["N"], row["fraction"]), {})[row["provider"]] = row
    for (t, n, _), pair in by_key.items():
        fused, base = pair["triton"], pair["torch"]
        lines.append(
            f"| {t} | {n} | {fused['max_length']} | {fused['mean_length']:.1f} | {fused['ms'] * 1e3:.1f} | {base['ms'] * 1e3:.1f} | "
            f"{base['ms'] / fused['ms']:.2f}x | {fused['useful_kv_GBps']:.0f} | {fused['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows, meta, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot", flush=True)
        return
    ts = sorted({row["T"] for row in rows})
    ns = sorted({row["N"] for row in rows})
    fig, axes = plt.subplots(len(ts), len(ns), figsize=(4 * len(ns), 3.2 * len(ts)), squeeze=False)
    for i, t in enumerate(ts):
        for j, n in enumerate(ns):
            ax = axes[i][j]
            for provider, style in (("triton", "o-"), ("torch", "s--")):
                sel = [r for r in rows if r["T"] == t and r["N"] == n and r["provider"] == provider]
                sel.sort(key=lambda r: r["max_length"])
                ax.plot([r["max_length"] for r in sel], [r["ms"] * 1e3 for r in sel], style, label=provider)
            ax.set_title(f"T={t}, N={n}")
            ax.set_xlabel("stream length, max if ragged (frames)")
            ax.set_ylabel("latency (us)")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(f"Indexed attention, {meta['gpu']}, {meta['dtype']}, H={meta['heads']} D={meta['head_dim']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_indexed_attention: CUDA is not available, nothing to measure (needs a GPU).")
        return 0
    try:
        import nemo_fastdecode  # noqa: F401
    except ImportError:  # run from a checkout without installing the package
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import triton

    rows, copy_gbps = run(args)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "slots": args.slots,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "chunk": args.chunk,
        "rel_pos": args.rel_pos,
        "timer": "do_bench_cudagraph" if args.cudagraph else "do_bench",
        "ragged": args.ragged,
        "copy_GBps": copy_gbps,
        "command": shlex.join([sys.executable, *sys.argv]),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.out}", flush=True)
    markdown = to_markdown(rows, meta)
    print(markdown)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown)
        print(f"wrote {args.md}", flush=True)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, meta, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
