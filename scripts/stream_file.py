"""Stream an audio file to a running ``nemo-fastdecode serve`` and print its transcript as it comes.

    nemo-fastdecode serve                        # terminal 1 (or: python -m nemo_fastdecode serve)
    python scripts/stream_file.py                # terminal 2: the first shipped example utterance and its reference
    python scripts/stream_file.py speech.wav     # partials as they come, then the final with word times

The file must be mono, at any rate from 8 to 48 kHz (the server resamples it to the model's). Without
a file, the first of the package's example utterances is sent and its reference text printed. A plain client of the
protocol (websockets, numpy, soundfile only: it starts at once), paced in real time unless ``--fast``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect


def example_utterance() -> tuple[str, str]:
    """The first example utterance shipped in the package (``nemo_fastdecode/assets/examples``): its path and its
    reference text. Found without importing the package, which would load NeMo."""
    spec = importlib.util.find_spec("nemo_fastdecode")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nemo_fastdecode is not installed, so there is no example utterance: pass an audio file")
    manifest = Path(next(iter(spec.submodule_search_locations))) / "assets" / "examples" / "manifest.jsonl"
    if not manifest.is_file():
        raise SystemExit(f"the example utterances are missing ({manifest} does not exist): pass an audio file")
    with open(manifest, encoding="utf8") as f:
        entry = json.loads(f.readline())
    return str(manifest.parent / entry["audio_filepath"]), entry["text"]


def read_pcm16(path: str) -> tuple[np.ndarray, int]:
    """int16 mono samples of an audio file and their rate."""
    import soundfile as sf

    data, rate = sf.read(path, dtype="int16", always_2d=True)
    if data.shape[1] != 1:
        raise SystemExit(f"{path}: {data.shape[1]} channels; the server takes mono audio")
    return data[:, 0], rate


async def stream(url: str, pcm: np.ndarray, rate: int, chunk_ms: float, fast: bool, api_key: str | None) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        first = json.loads(await ws.recv())
        if first["type"] == "error":
            print(f"refused: {first['error']['message']}", file=sys.stderr)
            return 1
        audio_input = {"format": {"type": "audio/pcm", "rate": rate}, "turn_detection": None}
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"type": "transcription", "audio": {"input": audio_input}}}
            )
        )

        async def send() -> None:
            step = max(1, int(rate * chunk_ms / 1000))
            for start in range(0, len(pcm), step):
                data = base64.b64encode(pcm[start : start + step].tobytes()).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": data}))
                if not fast:
                    await asyncio.sleep(chunk_ms / 1000)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))

        sender = asyncio.create_task(send())
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "conversation.item.input_audio_transcription.delta":
                print(event["delta"], end="", flush=True)
            elif event["type"] == "conversation.item.input_audio_transcription.completed":
                print(f"\nfinal: {event['transcript']!r}")
                for word in event["words"]:
                    print(f"  {word['start']:7.2f} {word['end']:7.2f}  {word['word']}")
                break
            elif event["type"] == "error":
                print(f"\nerror {event['error']['code']}: {event['error']['message']}", file=sys.stderr)
        await sender
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "audio", nargs="?", help="a mono WAV/FLAC file at the server's rate (default: the first example utterance)"
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--chunk-ms", type=float, default=80.0, help="audio per message")
    parser.add_argument("--fast", action="store_true", help="send as fast as the server reads (no real-time pacing)")
    args = parser.parse_args()
    path = args.audio
    if path is None:
        path, text = example_utterance()
        print(f"No file given: the example utterance {Path(path).name}\nreference: {text!r}", flush=True)
    pcm, rate = read_pcm16(path)
    return asyncio.run(stream(args.url, pcm, rate, args.chunk_ms, args.fast, args.api_key))


if __name__ == "__main__":
    raise SystemExit(main())
