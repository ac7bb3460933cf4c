"""The streaming audio front end: int16 PCM bytes of many streams in, mel features out, per engine cycle.

python benchmarks/bench_frontend.py                                  # 1024 and 5000 streams, 160 ms pushes (GPU)
python benchmarks/bench_frontend.py --streams 5000 --json /tmp/frontend.json --md /tmp/frontend.md
python benchmarks/bench_frontend.py --device cpu --streams 4 --cycles 2 --warmup 1   # smoke run (CPU)

Every cycle, each stream pushes ``--push-ms`` of new 16-bit PCM (bytes, as a socket gives them). Rows:

* ``AudioFrontEnd``: ``append`` (pack all streams' bytes into one pinned buffer, one host-to-device copy, the PCM
  decode kernel) + ``features`` (every complete frame of every stream, one batched pass). Columns: the cycle's
  wall time until the features are on the device (synchronised), the host time of the two calls, and the time between
  CUDA events recorded before ``append`` and after ``features`` (the GPU's span of the cycle).
* NeMo's ``AudioToMelSpectrogramPreprocessor`` on the same bytes: batched (int16 -> float32 on the host, one copy,
  one call on ``[streams, context + push]``, the context being the ``n_fft`` samples before the push, as a chunked
  caller must give it) and per stream (one copy and one call per stream; timed on at most ``--per-stream-max``
  streams and scaled to all of them, which the table says).

Times are medians over ``--cycles`` cycles after ``--warmup`` cycles. The last column checks the front end: the
largest ``|ours - NeMo|`` over the frames emitted for the first streams, against NeMo's preprocessor on each whole
stream so far (fp32, TF32 off).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

CHECKED_STREAMS = 8  # streams whose frames are compared with NeMo's whole-file features
DISTINCT_SIGNALS = 32  # stream i plays signal i % 32 (memory stays small for thousands of streams)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` synchronised calls."""
    seconds = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def bench_streams(preprocessor, streams: int, args: argparse.Namespace, device: torch.device) -> dict:
    """One row group: the front end and NeMo's preprocessor on ``streams`` streams of ``--push-ms`` pushes."""
    from fastdecode_lab.synthetic.audio import synthetic_audio
    from nemo_fastdecode.streaming.frontend import AudioFrontEnd

    rate = int(preprocessor._sample_rate)
    push = round(args.push_ms * rate / 1000)
    cycles = args.warmup + args.cycles
    signals = synthetic_audio([push * cycles / rate] * min(streams, DISTINCT_SIGNALS), sample_rate=rate)
    pcm = [np.round(x * 32768).astype("<i2") for x in signals]
    # the bytes of each cycle's push, per distinct signal (a socket hands over fresh bytes objects)
    pieces = [[p[c * push : (c + 1) * push].tobytes() for c in range(cycles)] for p in pcm]

    front = AudioFrontEnd(preprocessor, num_slots=streams, device=device, max_push_seconds=push / rate)
    for slot in range(streams):
        front.open(slot, sample_rate=rate)
    checked = min(streams, CHECKED_STREAMS)
    emitted: list[list[torch.Tensor]] = [[] for _ in range(checked)]
    cycle_s, host_s, events_s = [], [], []
    for c in range(cycles):
        pushes = {slot: pieces[slot % len(pieces)][c] for slot in range(streams)}
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _synchronize(device)
        start = time.perf_counter()
        if device.type == "cuda":
            begin.record()
        front.append(pushes)
        out = front.features()
        if device.type == "cuda":
            end.record()
        returned = time.perf_counter()
        _synchronize(device)
        if c >= args.warmup:
            cycle_s.append(time.perf_counter() - start)
            host_s.append(returned - start)
            if device.type == "cuda":
                events_s.append(begin.elapsed_time(end) / 1e3)
        for slot in range(checked):
            emitted[slot].append(out.for_slot(slot).cpu())

    # NeMo's preprocessor on the same bytes of one cycle, with the n_fft samples before the push as context
    context = front.settings.n_fft
    c = args.warmup
    window = [p[c * push - context : (c + 1) * push].tobytes() for p in pcm] if c > 0 else None
    if window is None:  # a single cycle: no audio before it
        window, context = [p[:push].tobytes() for p in pcm], 0
    length = push + context

    def nemo_batched() -> torch.Tensor:
        ints = np.stack([np.frombuffer(window[slot % len(window)], dtype="<i2") for slot in range(streams)])
        signal = torch.from_numpy(ints.astype(np.float32) / 32768).to(device, non_blocking=False)
        return preprocessor(input_signal=signal, length=torch.full((streams,), length, device=device))[0]

    per_stream = min(streams, args.per_stream_max)

    def nemo_per_stream() -> None:
        lengths = torch.tensor([length], device=device)
        for slot in range(per_stream):
            ints = np.frombuffer(window[slot % len(window)], dtype="<i2")
            signal = torch.from_numpy(ints.astype(np.float32) / 32768).to(device)
            preprocessor(input_signal=signal[None], length=lengths)

    nemo_batched()  # warm-up (cuFFT plans, cuBLAS handles)
    nemo_per_stream()
    batched_s = _timed(nemo_batched, device, args.cycles)
    per_stream_s = [t * streams / per_stream for t in _timed(nemo_per_stream, device, max(1, args.cycles // 4))]

    # exactness: our frames so far against NeMo's features of each checked stream's whole audio so far
    worst = 0.0
    for slot in range(checked):
        ours = torch.cat(emitted[slot], 1)
        signal = torch.from_numpy(pcm[slot % len(pcm)].astype(np.float32) / 32768).to(device)
        nemo, _ = preprocessor(input_signal=signal[None], length=torch.tensor([signal.numel()], device=device))
        worst = max(worst, (ours - nemo[0, :, : ours.shape[1]].cpu()).abs().max().item())
    frames = sum(t.shape[1] for t in emitted[0][args.warmup :]) / args.cycles
    return {
        "streams": streams,
        "push_samples": push,
        "bytes_per_cycle": 2 * push * streams,
        "frames_per_stream_per_cycle": frames,
        "ours_cycle_ms": _median_ms(cycle_s),
        "ours_host_ms": _median_ms(host_s),
        "ours_gpu_span_ms": _median_ms(events_s) if events_s else None,
        "nemo_batched_ms": _median_ms(batched_s),
        "nemo_per_stream_ms": _median_ms(per_stream_s),
        "nemo_per_stream_timed_streams": per_stream,
        "max_abs_diff_vs_nemo": worst,
    }


def _markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# Streaming audio front end on {env['gpu']}",
        "",
        f"Command: `{report['command']}`; {report['push_ms']} ms int16 pushes per stream and cycle, model preprocessor "
        f"of `{report['model']}`; commit {env['commit']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"Triton {env['triton']}, NeMo {env['nemo']}, driver {env['driver']}.",
        "",
        "| streams | MB/cycle | ours: cycle ms | ours: host ms | ours: GPU span ms | NeMo batched ms "
        "| NeMo per stream ms | max abs diff vs NeMo |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        span = "-" if r["ours_gpu_span_ms"] is None else f"{r['ours_gpu_span_ms']:.3f}"
        scaled = "" if r["nemo_per_stream_timed_streams"] == r["streams"] else " (scaled)"
        lines.append(
            f"| {r['streams']} | {r['bytes_per_cycle'] / 1e6:.2f} | {r['ours_cycle_ms']:.3f} | {r['ours_host_ms']:.3f} "
            f"| {span} | {r['nemo_batched_ms']:.3f} | {r['nemo_per_stream_ms']:.1f}{scaled} "
            f"| {r['max_abs_diff_vs_nemo']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1024, 5000])
    parser.add_argument("--push-ms", type=float, default=160.0, help="audio per stream and cycle")
    parser.add_argument("--cycles", type=int, default=20, help="timed cycles")
    parser.add_argument("--warmup", type=int, default=5, help="cycles before timing")
    parser.add_argument("--per-stream-max", type=int, default=256, help="streams timed in NeMo's per-stream loop")
    parser.add_argument("--model", default="tiny-streaming", help="synthetic preset whose preprocessor is used")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--md", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_frontend.py needs a CUDA GPU (or --device cpu for a smoke run); nothing to do here.")
        return None
    from fastdecode_lab.synthetic import build_synthetic_model
    from nemo_fastdecode.apps.environment import environment

    torch.backends.cuda.matmul.allow_tf32 = False  # NeMo's mel product in fp32, as the front end's
    # every cache-aware preset has the same 80-feature preprocessor; the small model builds fastest
    preprocessor = build_synthetic_model(args.model, balance_joint=False).preprocessor.to(device).eval()
    report = {
        "command": "python benchmarks/bench_frontend.py " + " ".join(argv),
        "model": args.model,
        "push_ms": args.push_ms,
        "environment": environment(device),
        "results": [],
    }
    with torch.inference_mode():
        for streams in args.streams:
            report["results"].append(bench_streams(preprocessor, streams, args, device))
            print(json.dumps(report["results"][-1]), flush=True)
    text = _markdown(report)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
