"""Where the offline path's encoder time goes, and what each candidate speed-up buys, on the offline path's batches.

python benchmarks/experiments/encoder_profile.py --preset tdt-0.6b --seconds 1800 --out /tmp/enc

On the batches the offline path plans (length-sorted, budgeted) for ``--seconds`` of LibriSpeech-like audio, for
each precision (fp32, bf16 autocast, bf16 weights):

- ``eager``: NeMo's encoder as it is, the GPU synchronised once at the end; ``host``: the seconds the calls take to
  return (issue time: when it is close to the total, the encoder is launch-bound);
- ``sdpa``: NeMo's own ``use_pytorch_sdpa`` attention;
- ``graphs``: one CUDA graph per batch shape, captured first, replayed (the bound of what graphs buy; capture
  seconds reported apart);
- ``bucketed``: the features padded to a coarse ladder of lengths before the encoder (what graphs per length bucket
  need), and whether the valid frames equal the unpadded run's bit for bit;
- ``fast_encoder``: the offline path's opt-in fused convolution modules (:mod:`nemo_fastdecode.offline.fast_encoder`);
- a ``torch.profiler`` table of the eager run's kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch

from fastdecode_lab import synthetic
from nemo_fastdecode.offline.batching import plan_batches
from nemo_fastdecode.offline.fast_encoder import fast_encoder


def _sync() -> None:
    torch.cuda.synchronize()


def features(model, seconds: float, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    durations = synthetic.librispeech_like_durations(total_seconds=seconds, seed=0)
    audio = synthetic.synthetic_audio(durations, seed=0)
    rate = 16000
    plan = plan_batches([len(a) for a in audio], 4 * batch_size, int(30.0 * batch_size * rate))
    out = []
    for batch in plan:
        longest = max(len(audio[i]) for i in batch)
        signal = torch.zeros(len(batch), longest)
        for row, i in enumerate(batch):
            signal[row, : len(audio[i])] = torch.from_numpy(audio[i])
        lengths = torch.tensor([len(audio[i]) for i in batch])
        with torch.inference_mode():
            feats, feat_lengths = model.preprocessor(input_signal=signal.cuda(), length=lengths.cuda())
        out.append((feats.contiguous(), feat_lengths))
    return out


def run_eager(encoder, batches, autocast) -> tuple[float, float, list]:
    outs = []
    _sync()
    start = time.perf_counter()
    host = 0.0
    with autocast, torch.inference_mode():
        for feats, lengths in batches:
            t = time.perf_counter()
            outs.append(encoder(audio_signal=feats, length=lengths))
            host += time.perf_counter() - t
    _sync()
    return time.perf_counter() - start, host, outs


def ladder(frames: int, step: int = 64) -> int:
    """A coarse ladder: multiples of ``step`` feature frames up to 8 steps, then 12.5% apart."""
    bucket = step
    while bucket < frames:
        bucket = bucket + step if bucket < 8 * step else int(bucket * 1.125 + step - 1) // step * step
    return bucket


def run_graphs(encoder, batches, autocast, pad_to_ladder: bool) -> dict:
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    capture = 0.0
    statics = []
    with autocast, torch.inference_mode():
        for feats, lengths in batches:
            b, f, t = feats.shape
            tb = ladder(t) if pad_to_ladder else t
            key = (b, tb)
            if key not in graphs:
                _sync()
                start = time.perf_counter()
                x = torch.zeros(b, f, tb, device=feats.device, dtype=feats.dtype)
                n = lengths.clone()
                n.fill_(t)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    encoder(audio_signal=x, length=n)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    y = encoder(audio_signal=x, length=n)
                _sync()
                capture += time.perf_counter() - start
                graphs[key] = (graph, x, n, y)
            statics.append(key)
        outs = []
        _sync()
        start = time.perf_counter()
        for (feats, lengths), key in zip(batches, statics, strict=True):
            graph, x, n, y = graphs[key]
            t = feats.shape[2]
            x[:, :, :t].copy_(feats)
            if pad_to_ladder:
                x[:, :, t:].zero_()
            n.copy_(lengths)
            graph.replay()
            outs.append((y[0].clone(), y[1].clone()))
        _sync()
        replay = time.perf_counter() - start
    return {"graphs": len(graphs), "capture_s": capture, "replay_s": replay, "outs": outs}


def compare(reference, outs) -> dict:
    bitwise = 0
    worst = 0.0
    for (ref, ref_len), (out, _out_len) in zip(reference, outs, strict=True):
        for row in range(ref.shape[0]):
            n = int(ref_len[row])
            a = ref[row, :, :n].float()
            b = out[row, :, :n].float()
            bitwise += bool(torch.equal(a, b))
            worst = max(worst, float((a - b).abs().max()))
    rows = sum(r[0].shape[0] for r in reference)
    return {"rows_bitwise_equal": bitwise, "rows": rows, "max_abs_diff": worst}


def set_sdpa(encoder, on: bool) -> None:
    for layer in encoder.layers:
        layer.self_attn.use_pytorch_sdpa = on


def profile_table(encoder, batches, autocast, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run_eager(encoder, batches, autocast)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    with open(path, "w") as f:
        f.write(table)
    print(table[:6000])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tdt-0.6b")
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="/tmp/encoder_profile")
    parser.add_argument("--precisions", default="fp32,bf16-autocast,bf16-weights")
    parser.add_argument("--skip", default="", help="comma-separated: sdpa,graphs")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = synthetic.build_synthetic_model(args.preset, device="cuda")
    model.eval()
    batches = features(model, args.seconds, args.batch_size)
    results: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "batches": [list(f.shape) for f, _ in batches],
    }
    print("batches", results["batches"])
    encoder = model.encoder
    skip = set(args.skip.split(","))
    for precision in args.precisions.split(","):
        if precision == "bf16-weights":
            encoder.to(torch.bfloat16)
            data = [(f.to(torch.bfloat16), n) for f, n in batches]
            autocast = contextlib.nullcontext()
        else:
            encoder.float()
            data = batches
            autocast = (
                torch.autocast("cuda", dtype=torch.bfloat16)
                if precision == "bf16-autocast"
                else contextlib.nullcontext()
            )
        row: dict = {}
        run_eager(encoder, data, autocast)  # warm up
        eager, host, reference = min((run_eager(encoder, data, autocast) for _ in range(3)), key=lambda r: r[0])
        row["eager_s"], row["host_s"] = eager, host
        if "sdpa" not in skip:
            set_sdpa(encoder, True)
            run_eager(encoder, data, autocast)
            sdpa, sdpa_host, sdpa_outs = min((run_eager(encoder, data, autocast) for _ in range(3)), key=lambda r: r[0])
            row["sdpa_s"], row["sdpa_host_s"] = sdpa, sdpa_host
            row["sdpa_vs_eager"] = compare(reference, sdpa_outs)
            set_sdpa(encoder, False)
        with fast_encoder(model) as fused:
            run_eager(encoder, data, autocast)
            fast, fast_host, fast_outs = min((run_eager(encoder, data, autocast) for _ in range(3)), key=lambda r: r[0])
            row["fast_encoder"] = {"modules": fused, "s": fast, "host_s": fast_host} | compare(reference, fast_outs)
            profile_table(encoder, data, autocast, os.path.join(args.out, f"profile_fast_encoder_{precision}.txt"))
        if "graphs" not in skip:
            for pad in (False, True):
                name = "bucketed" if pad else "graphs"
                try:
                    g = run_graphs(encoder, data, autocast, pad)
                    g2 = run_graphs(encoder, data, autocast, pad)  # fresh capture: the second number is the steady one
                    row[name] = {k: v for k, v in g2.items() if k != "outs"} | {
                        "vs_eager": compare(reference, g2["outs"])
                    }
                    row[name]["first_capture_s"] = g["capture_s"]
                except Exception as error:  # noqa: BLE001 -- an experiment: report and go on
                    row[name] = {"error": repr(error)[:2000]}
                torch.cuda.empty_cache()
            try:
                eager_pad = [(torch.nn.functional.pad(f, (0, ladder(f.shape[2]) - f.shape[2])), n) for f, n in data]
                t, _, outs = run_eager(encoder, eager_pad, autocast)
                row["eager_padded_s"] = t
                row["eager_padded_vs_eager"] = compare(reference, outs)
            except Exception as error:  # noqa: BLE001
                row["eager_padded"] = {"error": repr(error)[:2000]}
        profile_table(encoder, data, autocast, os.path.join(args.out, f"profile_{precision}.txt"))
        results[precision] = row
        print(precision, json.dumps(row, indent=1))
    with open(os.path.join(args.out, "encoder_profile.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
