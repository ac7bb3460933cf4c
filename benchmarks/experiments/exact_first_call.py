"""First-call cost of the exact greedy decoder with the few-row kernel (one-off measurement, kept with its result).

python3 benchmarks/experiments/exact_first_call.py      # on a GPU, in a fresh process, about a minute

Prints, in one fresh process: the NVRTC compilation of the few-row kernels (``few_row_gemm.prepare``), then for the
TDT 0.6B synthetic model on one batch of 32 random encoder outputs (fp32, 400 frames) the first and the next decode
of ``FastGreedyBatchedInfer`` (exact path, full graph), with the few-row kernel and with it switched off.
"""

import time

import torch

import nemo_fastdecode  # noqa
from fastdecode_lab import synthetic
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.kernels import few_row_gemm


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def main() -> None:
    device = torch.device("cuda")
    seconds, _ = timed(lambda: few_row_gemm.prepare(device))
    print(f"few_row_gemm.prepare (NVRTC, 3 kernels, fresh process): {seconds:.3f} s", flush=True)
    model = synthetic.build_synthetic_model("tdt-0.6b", device=device)
    spec = synthetic.transducer_spec(model)
    g = torch.Generator(device="cuda").manual_seed(0)
    encoded = torch.randn([32, model.cfg.encoder.d_model, 400], device=device, generator=g)
    lengths = torch.full([32], 400, device=device)
    original = few_row_gemm.available
    for name, available in (("few_row_gemm", original), ("triton_ieee", lambda d: False)):
        few_row_gemm.available = available
        decoder = FastGreedyBatchedInfer(model.decoder, model.joint, spec.blank_id, max_symbols_per_step=10,
                                         durations=spec.durations, graph_mode="full_graph")  # fmt: skip
        with torch.inference_mode():
            first, hyps = timed(lambda: decoder(encoder_output=encoded, encoded_lengths=lengths))  # noqa: B023
            second, _ = timed(lambda: decoder(encoder_output=encoded, encoded_lengths=lengths))  # noqa: B023
        tokens = sum(len(h.y_sequence) for h in hyps[0])
        print(f"{name}: first decode {first:.3f} s, next {second:.4f} s, {tokens} tokens", flush=True)
    few_row_gemm.available = original


if __name__ == "__main__":
    main()
