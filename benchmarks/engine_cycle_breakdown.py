"""Where one ``StreamingEngine.poll`` goes, part by part, with N streams each pushing one chunk period per cycle.

python benchmarks/engine_cycle_breakdown.py                                    # CPU: tiny model, 256 and 1,024 streams
python benchmarks/engine_cycle_breakdown.py --host-only                        # CPU: the host's share alone (see below)
python benchmarks/engine_cycle_breakdown.py --model hybrid-17x512-streaming --att 70 1 --streams 256 1024   # a GPU
python benchmarks/engine_cycle_breakdown.py --model hybrid-17x512-streaming --att 70 1 --input-rate 24000   # 24 kHz in

Every stream plays synthetic int16 speech; each timed cycle pushes one chunk period (160 ms at ``[70, 1]`` or
``[16, 1]``) to every stream (not timed), then one poll steps them all. Each part is timed between two
synchronisations: the cycle's audio taken from the inbox, the front end (``append_staged``, ``features``), the
feature queue, the step (encoder + decoder), the cycle's device reads and events; "rest" is the poll minus the parts.
A last cycle finishes every stream: its final events (with word timestamps) and freed slots.

``--host-only`` (for a CPU, where the device work runs as torch references at CPU speed): the front end's PCM decode,
frame cut and spectrum return placeholders and the step appends one random token per stream, so what is left is the
host work a cycle does per stream and the device work of the queue's gather and scatter.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import pstats
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

import fastdecode_lab.models  # noqa: F401  (synthetic presets as model names)
import nemo_fastdecode.streaming.frontend as frontend
from fastdecode_lab import synthetic
from nemo_fastdecode.apps.models import load_model
from nemo_fastdecode.streaming import StreamingEngine
from nemo_fastdecode.streaming.events import StreamOptions

PARTS = {  # name: (engine attribute owning the method or None for the engine, method)
    "inbox.take": ("inbox", "take"),
    "front.append_staged": ("front", "append_staged"),
    "front.features": ("front", "features"),
    "queue.write": ("queue", "write"),
    "queue.read": ("queue", "read"),
    "step": ("transcriber", "step"),
    "grew (device read)": ("event_builder", "grew"),
    "events": ("event_builder", "events"),
    "free": (None, "_free"),
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(method: Callable, name: str, spent: dict[str, float], device: torch.device) -> Callable:
    def timed(*args, **kwargs):
        _synchronize(device)
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            _synchronize(device)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

    return timed


@contextlib.contextmanager
def timed_parts(engine: StreamingEngine, spent: dict[str, float]) -> Iterator[None]:
    """Wrap the engine's parts (instance attributes over the methods): seconds summed per part into ``spent``."""
    patched = []
    for name, (owner, attribute) in PARTS.items():
        obj = engine if owner is None else getattr(engine, owner)
        patched.append((obj, attribute, vars(obj).get(attribute)))  # an instance attribute (a stub) comes back
        setattr(obj, attribute, _timed(getattr(obj, attribute), name, spent, engine.device))
    try:
        yield
    finally:
        for obj, attribute, before in patched:
            if before is None:
                delattr(obj, attribute)
            else:
                setattr(obj, attribute, before)


def push_all(engine: StreamingEngine, ids: list[int], pcms: list[np.ndarray], position: int, push: int) -> None:
    """``push`` samples to every stream from ``position`` on (stream ``j`` plays ``pcms[j % len]``, shifted)."""
    for j, stream_id in enumerate(ids):
        start = position + 37 * j  # streams at different points of their audio
        engine.push(stream_id, np.take(pcms[j % len(pcms)], np.arange(start, start + push), mode="wrap"))


def stub_device_work(engine: StreamingEngine, blank: int) -> None:
    """``--host-only``: placeholders for the front end's device work, one random token per stream for the step."""
    frontend.pcm_frames_reference = lambda *args, **kwargs: None
    frontend.stft_frames_reference = lambda ring, window, index, **kwargs: torch.empty(index.stream_of.shape[0], 1)
    front, placeholder = engine.front, torch.zeros(0)

    def spectrum_to_mel(frames: torch.Tensor, count: int) -> torch.Tensor:
        nonlocal placeholder  # one zero buffer, grown: a fresh [F, R] would time a host memset no GPU host does
        size = front.settings.features * count
        if placeholder.numel() < size:
            placeholder = torch.zeros(size)
        return placeholder[:size].view(front.settings.features, count)

    front._spectrum_to_mel = spectrum_to_mel
    decoder, generator = engine.transcriber.decoder, torch.Generator().manual_seed(0)

    def step(slot_ids, batch, lengths=None):
        with torch.inference_mode():
            rows = torch.as_tensor(slot_ids, dtype=torch.long)
            columns = decoder.counts[rows] % decoder.token_capacity
            decoder.labels[rows, columns] = torch.randint(0, blank, (len(rows),), generator=generator)
            decoder.timestamps[rows, columns] = columns
            decoder.counts[rows] = columns + 1
            decoder._decoded[rows.numpy()] = True

    engine.transcriber.step = step


def run(args: argparse.Namespace) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.host_only else "cpu")
    if args.host_only:  # one thread: tiny CPU ops that wake a thread pool time the scheduler, not the work
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_model(args.model, device=device, vocab=args.vocab)  # synthetic: calibrated to ~0.3 tokens/frame
    audio = synthetic.synthetic_audio([4.0, 3.0, 5.0], seed=7)  # at the model's 16 kHz
    if args.input_rate is not None and args.input_rate != 16000:  # the streams' rate: the front end resamples
        from scipy.signal import resample_poly

        common = math.gcd(args.input_rate, 16000)
        audio = [resample_poly(np.asarray(x, np.float64), args.input_rate // common, 16000 // common) for x in audio]
    pcms = [np.clip(np.asarray(x) * 32767, -32768, 32767).astype(np.int16) for x in audio]
    for n in args.streams:
        measure(model, pcms, n, args, device)


def measure(model: torch.nn.Module, pcms: list[np.ndarray], n: int, args: argparse.Namespace, device: torch.device):
    """Time ``args.repeats`` cycles of ``n`` streams, then their finishing cycles; print the parts."""
    engine = StreamingEngine(
        model,
        n,
        att_context_size=args.att,
        use_cuda_graphs=device.type == "cuda",
        dtype=getattr(torch, args.dtype),
        encoder_matmul=args.encoder_matmul,
    )
    if args.host_only:
        stub_device_work(engine, int(model.decoding.blank_id))
    else:
        engine.warm_up()
    rate = args.input_rate or engine.front.settings.sample_rate
    ids = [engine.open(StreamOptions(partial_words=args.partial_words, sample_rate=rate)) for _ in range(n)]
    push = round(engine.geometry.chunk_seconds * rate)
    position = 0
    for _ in range(3):  # first chunks, lazy set-up
        push_all(engine, ids, pcms, position, push)
        position += push
        while engine.busy:
            engine.poll()
    polls, parts, events = [], {}, 0
    profile = cProfile.Profile() if args.profile else None
    for _ in range(args.repeats):
        push_all(engine, ids, pcms, position, push)
        position += push
        spent: dict[str, float] = {}
        with timed_parts(engine, spent), profile or contextlib.nullcontext():
            _synchronize(device)
            started = time.perf_counter()
            events += len(engine.poll())
            _synchronize(device)
            polls.append(time.perf_counter() - started)
        for name, seconds in spent.items():
            parts.setdefault(name, []).append(seconds)
    if args.torch_profile:
        profile_one_poll(engine, ids, pcms, position, push, args.torch_profile)
    for stream_id in ids:
        engine.finish(stream_id)
    last: dict[str, float] = {}
    finals = []
    with timed_parts(engine, last):
        started = time.perf_counter()
        while engine.open_streams:
            finals += engine.poll()
        _synchronize(device)
        ending = time.perf_counter() - started
    poll_ms = 1e3 * float(np.median(polls))
    medians = {name: 1e3 * float(np.median(seconds)) for name, seconds in parts.items()}
    print(
        f"== {n} streams at {rate} Hz on the {device.type}{' (host only)' if args.host_only else ''}: poll "
        f"{poll_ms:.3f} ms "
        f"(median of {args.repeats}), {events / args.repeats:.0f} partial events per cycle"
    )
    for name in PARTS:
        if name in medians:
            print(f"   {name:20s} {medians[name]:9.3f} ms")
    print(f"   {'rest':20s} {poll_ms - sum(medians.values()):9.3f} ms")
    print(
        f"   finishing every stream: {1e3 * ending:.1f} ms for {len(finals)} final events ("
        + ", ".join(f"{name} {1e3 * seconds:.2f} ms" for name, seconds in last.items())
        + ")"
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


def profile_one_poll(
    engine: StreamingEngine, ids: list[int], pcms: list[np.ndarray], position: int, push: int, rows: int
) -> None:
    """torch.profiler over one more poll (its pushes not profiled): operators by host time and by device time."""
    from torch.profiler import ProfilerActivity, profile

    push_all(engine, ids, pcms, position, push)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        engine.poll()
        _synchronize(engine.device)
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=rows))
    if engine.device.type == "cuda":
        print(table.table(sort_by="self_cuda_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-streaming", help="a cache-aware synthetic preset or .nemo path")
    parser.add_argument("--vocab", default="bpe", choices=["bpe", "char"], help="a synthetic model's vocabulary")
    parser.add_argument("--att", type=int, nargs=2, default=[16, 1], help="att_context_size [left, lookahead]")
    parser.add_argument("--streams", type=int, nargs="+", default=[256, 1024])
    parser.add_argument(
        "--input-rate", type=int, default=None, help="the streams' PCM rate (default: the model's; others resampled)"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the engine's dtype")
    parser.add_argument("--encoder-matmul", default="fp32", choices=["fp32", "tf32x3", "tf32"], help="encoder GEMMs")
    parser.add_argument("--repeats", type=int, default=10, help="timed cycles per stream count")
    parser.add_argument("--host-only", action="store_true", help="placeholders for the device work (CPU)")
    parser.add_argument("--partial-words", action="store_true", help="word timestamps on partial events too")
    parser.add_argument("--profile", type=int, default=0, metavar="TOP", help="cProfile the timed polls: top rows")
    parser.add_argument(
        "--torch-profile", type=int, default=0, metavar="TOP", help="torch.profiler over one more poll: top operators"
    )
    run(parser.parse_args())


if __name__ == "__main__":
    main()
