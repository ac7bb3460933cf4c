"""``nemo-fastdecode loadtest``: clients on this machine stream audio to a server; latency, throughput, exactness.

nemo-fastdecode loadtest                                         # 6 clients, the example utterances, ws://127.0.0.1:8000
nemo-fastdecode loadtest clients=1 audio_files=[speech.wav] check=false model=/path/model.nemo
nemo-fastdecode loadtest clients_sweep=[250,500,1000,2000] processes=8 model=/path/model.nemo  # a GPU server
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nemo_fastdecode.apps.configs import LoadtestConfig
from nemo_fastdecode.apps.loadtest.client import ClientResult, check_server, item_ends, run_client
from nemo_fastdecode.apps.loadtest.report import LoadPoint, LoadtestResult, format_markdown, summarize, write_result
from nemo_fastdecode.apps.loadtest.server_metrics import histogram_quantiles_ms, metrics_url, scrape_histograms
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.apps.streaming_reference import Reference

__all__ = ["load_inputs", "main", "references", "run", "run_point"]

SAMPLE_RATE = 16000


def load_inputs(config: LoadtestConfig) -> tuple[list[np.ndarray], list[str | None]]:
    """int16 PCM ``[T]`` per input at ``input_rate`` (files read at 16 kHz as NeMo reads them, cut to
    ``max_audio_seconds``, then resampled to ``input_rate``); and
    each input's reference text (``None`` where it has none, or where the cut shortened it).

    With no audio given: the shipped example utterances and their texts, or made audio for a model of a registered family (a
    synthetic preset).
    """
    from nemo_fastdecode.apps.manifests import load_audio, read_inputs
    from nemo_fastdecode.apps.models import model_family
    from nemo_fastdecode.apps.trained_models import EXAMPLES_MANIFEST

    if config.audio_files is not None:
        floats = load_audio(config.audio_files, SAMPLE_RATE)
        texts: list[str | None] = [None] * len(floats)
    elif config.dataset_manifest is not None or model_family(config.model) is None:
        utterances = read_inputs(dataset_manifest=config.dataset_manifest or EXAMPLES_MANIFEST)
        floats = load_audio([u.audio_path for u in utterances], SAMPLE_RATE)
        texts = [u.entry.get("text") if isinstance(u.entry.get("text"), str) else None for u in utterances]
    else:
        floats = model_family(config.model).demo_audio(config.synthetic_seconds, config.seed)
        texts = [None] * len(floats)
    cut = None if config.max_audio_seconds is None else round(config.max_audio_seconds * SAMPLE_RATE)
    texts = [None if cut is not None and len(f) > cut else text for f, text in zip(floats, texts, strict=True)]
    floats = [resampled(f[:cut], SAMPLE_RATE, config.input_rate) for f in floats]
    return [np.clip(np.round(f * 32768), -32768, 32767).astype(np.int16) for f in floats], texts


def resampled(signal: np.ndarray, rate: int, to_rate: int) -> np.ndarray:
    """``signal`` at ``rate`` Hz resampled to ``to_rate`` Hz by scipy's polyphase resampler (the server's method)."""
    if rate == to_rate:
        return signal
    from scipy.signal import resample_poly

    common = math.gcd(rate, to_rate)
    return resample_poly(np.asarray(signal, dtype=np.float64), to_rate // common, rate // common)


def references(config: LoadtestConfig, inputs: Sequence[np.ndarray]) -> list[list[Reference]]:
    """Per input, NeMo's cache-aware streaming of each of its items alone (the audio between two of the client's
    commits), on the server's model."""
    from nemo_fastdecode.apps.models import inference_device, load_model
    from nemo_fastdecode.apps.streaming_reference import reference_transcript

    model = load_model(config.model, device=inference_device(config.cuda), seed=config.seed)
    out = []
    for pcm in inputs:
        ends = item_ends(len(pcm), config.input_rate, config.chunk_ms, config.commit_every_seconds)
        items = [pcm[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        if config.input_rate != SAMPLE_RATE:  # what the server's resampler makes of each item (a stream of its own)
            items = [resampled(item / 32768, config.input_rate, SAMPLE_RATE).astype(np.float32) for item in items]
        out.append([reference_transcript(model, item, config.att_context_size) for item in items])
    return out


async def _run_group(
    config: LoadtestConfig, inputs: Sequence[np.ndarray], clients: Sequence[int], starts: Sequence[float]
) -> list[ClientResult]:
    tasks = [
        run_client(
            config.url,
            inputs[i % len(inputs)],
            index=i,
            audio_index=i % len(inputs),
            start_at=start,
            rate=config.input_rate,
            chunk_ms=config.chunk_ms,
            realtime=config.realtime,
            binary=config.binary,
            commit_every_seconds=config.commit_every_seconds,
            api_key=config.api_key,
            timeout=config.timeout_seconds,
        )
        for i, start in zip(clients, starts, strict=True)
    ]
    return list(await asyncio.gather(*tasks))


#: seconds from the moment every client process is up to the first scheduled start
_START_MARGIN = 0.1
#: seconds the client processes get to start (spawn and imports) before the point fails
_STARTUP_TIMEOUT = 300.0

# a client process's start line: (barrier of every process and the parent, the shared start time), set at spawn
_start_line: tuple[Any, Any] | None = None


def _join_start_line(barrier: Any, t0: Any) -> None:
    global _start_line
    _start_line = (barrier, t0)


def _run_group_in_process(args: tuple) -> list[ClientResult]:
    """One client process's clients: after every process is up (its imports take seconds, longer than the stagger),
    at the parent's start time plus each client's offset, so the starts stay staggered as scheduled."""
    config, inputs, clients, offsets = args
    assert _start_line is not None, "client processes are started by run_point"
    barrier, t0 = _start_line
    barrier.wait(_STARTUP_TIMEOUT)  # every process is up
    barrier.wait(_STARTUP_TIMEOUT)  # and the parent has set the start time
    return asyncio.run(_run_group(config, inputs, clients, [t0.value + o for o in offsets]))


def run_point(
    config: LoadtestConfig,
    inputs: Sequence[np.ndarray],
    clients: int,
    refs: list[list[Reference]] | None,
    texts: Sequence[str | None] | None = None,
) -> LoadPoint:
    """``clients`` clients, staggered, over ``config.processes`` processes (one asyncio loop each); with the
    server's own cycle and chunk-latency quantiles over the point where its ``/metrics`` answer, and the finals'
    WER against ``texts`` (each input's reference text or ``None``) where there are any."""
    scrape_at = metrics_url(config.url)
    before = scrape_histograms(scrape_at)
    rng = np.random.default_rng(config.seed)
    offsets = rng.uniform(0.0, config.stagger_seconds, clients) if config.stagger_seconds else np.zeros(clients)
    groups = [list(range(p, clients, config.processes)) for p in range(min(config.processes, clients))]
    jobs = [(config, list(inputs), group, [float(offsets[i]) for i in group]) for group in groups]
    if len(jobs) == 1:
        t0 = time.monotonic()
        results = asyncio.run(_run_group(config, list(inputs), groups[0], [t0 + float(o) for o in offsets]))
    else:  # CLOCK_MONOTONIC is one clock for every process of the machine
        context = multiprocessing.get_context("spawn")
        barrier, start = context.Barrier(len(jobs) + 1), context.Value("d", 0.0)
        with concurrent.futures.ProcessPoolExecutor(
            len(jobs), mp_context=context, initializer=_join_start_line, initargs=(barrier, start)
        ) as pool:
            parts = pool.map(_run_group_in_process, jobs)  # each job holds its process at the barrier: one each
            barrier.wait(_STARTUP_TIMEOUT)
            start.value = t0 = time.monotonic() + _START_MARGIN
            barrier.wait(_STARTUP_TIMEOUT)
            results = [r for part in parts for r in part]
    wall = max((r.finished for r in results), default=t0) - t0
    point = summarize(clients, sorted(results, key=lambda r: r.index), wall, refs, texts)
    after = scrape_histograms(scrape_at) if before is not None else None
    if after is not None:
        point.server_ms = histogram_quantiles_ms(before, after)
    return point


def run(config: LoadtestConfig) -> LoadtestResult:
    """The load test (one point, or a sweep over ``clients_sweep``); writes JSON, Markdown and a sweep's plot.

    Raises:
        ConnectionError: no server at ``config.url`` (checked first).
    """
    from nemo_fastdecode.apps.environment import environment

    check_server(config.url)  # before the inputs and references take their time
    inputs, texts = load_inputs(config)
    refs = references(config, inputs) if config.check else None
    points = [run_point(config, inputs, int(n), refs, texts) for n in (config.clients_sweep or [config.clients])]
    result = LoadtestResult(config=dataclasses.asdict(config), environment=environment(), points=points)
    write_result(result, Path(config.output_dir), config.tag)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(LoadtestConfig, list(argv or []), "nemo-fastdecode loadtest")
    try:
        result = run(config)
    except ConnectionError as error:
        print(f"nemo-fastdecode loadtest: {error}", file=sys.stderr)
        return 2
    print(format_markdown(result))
    print("\n" + ", ".join(f"{k}: {v}" for k, v in result.files.items()))
    return 0 if result.passed else 1
