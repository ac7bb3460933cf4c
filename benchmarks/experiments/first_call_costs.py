"""What the offline path's first ``transcribe`` pays once per process, measured piece by piece in fresh processes.

python benchmarks/experiments/first_call_costs.py                 # on a GPU: every case, a few seconds each
python benchmarks/experiments/first_call_costs.py --device cpu    # the same logic on the CPU (fp32 cases only)

The first-call profiles (``benchmarks/results/archive/profile_transcribe-first-call_*``) put part of the first
call's extra time in two one-time costs: NeMo's prediction network (cuDNN LSTM, under bf16 autocast) the first time
it runs at the batch's size (0.11-0.15 s, inside the decoder's buffer allocation, where it computes the state after
``<SOS>``), and the first large allocations (``torch.zeros``, 0.24 s). Each case here runs in a new process, so
nothing is warm but what the case warms:

- ``lstm``: after a warm-up (none; batch 1 in fp32, as the decoder's warm-up at construction does; batch 1 under
  bf16 autocast; the measured batch size under bf16 autocast), the seconds of ``decoder.predict`` of ``<SOS>`` at
  batch ``--batch`` under bf16 autocast, then the same call again, then at another batch size.
- ``alloc``: the first ``torch.zeros`` of ``--gib`` GiB, the same after freeing it (the caching allocator keeps the
  block), and the first after the allocator reserved and released a block of that size at start-up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

WARM_UPS = ("none", "fp32-batch1", "bf16-batch1", "bf16-same-batch")


def _seconds(device, fn) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def lstm_case(warm_up: str, batch: int, other_batch: int, layers: int, device_name: str) -> str:
    import torch
    from nemo.collections.asr.modules import RNNTDecoder

    device = torch.device(device_name)
    decoder = RNNTDecoder(
        prednet={"pred_hidden": 640, "pred_rnn_layers": layers, "dropout": 0.0}, vocab_size=1024, blank_as_pad=True
    ).to(device)
    decoder.eval()
    bf16 = device.type == "cuda"

    def sos(rows: int, autocast: bool) -> None:
        # as GreedyComputerBase.initial_state: the state in the decode's dtype (bf16 under autocast)
        like = torch.zeros([rows, 1, 1], dtype=torch.bfloat16 if autocast else torch.float32, device=device)
        labels = torch.full([rows, 1], 1024, dtype=torch.long, device=device)
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            decoder.predict(labels, decoder.initialize_state(like), add_sos=False, batch_size=rows)

    warm = {
        "none": lambda: None,
        "fp32-batch1": lambda: sos(1, False),
        "bf16-batch1": lambda: sos(1, bf16),
        "bf16-same-batch": lambda: sos(batch, bf16),
    }[warm_up]
    warm_seconds = _seconds(device, warm)
    first = _seconds(device, lambda: sos(batch, bf16))
    again = _seconds(device, lambda: sos(batch, bf16))
    other = _seconds(device, lambda: sos(other_batch, bf16))
    precision = "bf16 autocast" if bf16 else "fp32"
    return (
        f"lstm ({layers} layers, {precision}) warm-up {warm_up:16s} {warm_seconds * 1e3:8.1f} ms | batch {batch}: "
        f"first {first * 1e3:8.1f} ms, again {again * 1e3:6.1f} ms | then batch {other_batch}: {other * 1e3:6.1f} ms"
    )


def alloc_case(gib: float, reserve_first: bool, device_name: str) -> str:
    import torch

    device = torch.device(device_name)
    elements = int(gib * (1 << 30)) // 4
    torch.empty(1, device=device)  # the context, outside the timing
    reserve = 0.0
    if reserve_first:
        reserve = _seconds(device, lambda: torch.empty(elements, device=device))  # freed at once, kept cached
    first = _seconds(device, lambda: torch.zeros(elements, device=device))
    again = _seconds(device, lambda: torch.zeros(elements, device=device))
    label = "after a start-up reserve" if reserve_first else "cold allocator"
    return (
        f"alloc {gib:g} GiB ({label:24s}) reserve {reserve * 1e3:7.1f} ms | first zeros {first * 1e3:7.1f} ms, "
        f"again {again * 1e3:6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=128, help="the offline path's largest batch (rows)")
    parser.add_argument("--other-batch", type=int, default=96)
    parser.add_argument("--layers", type=int, default=1, help="LSTM layers (rnnt-0.6b: 1, tdt-0.6b: 2)")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--case", nargs="*", help=argparse.SUPPRESS)  # one case, in a child process
    args = parser.parse_args()
    if args.case:
        kind, *rest = args.case
        if kind == "lstm":
            print(lstm_case(rest[0], args.batch, args.other_batch, args.layers, args.device), flush=True)
        else:
            print(alloc_case(args.gib, rest[0] == "reserve", args.device), flush=True)
        return
    cases = [["lstm", w] for w in WARM_UPS] + [["alloc", "cold"], ["alloc", "reserve"]]
    common = ["--device", args.device, "--batch", str(args.batch), "--other-batch", str(args.other_batch)]
    common += ["--layers", str(args.layers), "--gib", str(args.gib)]
    for case in cases:
        done = subprocess.run(
            [sys.executable, __file__, *common, "--case", *case], capture_output=True, text=True, check=False
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(("lstm", "alloc"))]
        print(lines[-1] if lines else f"{' '.join(case)}: failed\n{done.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
