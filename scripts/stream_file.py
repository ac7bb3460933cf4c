"""Stream an audio file to a running ``nemo-fastdecode serve`` and print its transcript as it comes.

    nemo-fastdecode serve                        # terminal 1 (or: python -m nemo_fastdecode.serve)
    python scripts/stream_file.py speech.wav     # terminal 2: partials as they come, then the final with word times

The file must be mono at the server's rate (16 kHz for NeMo's models; ``sox in.wav -r 16000 -c 1 out.wav``). Without
a file, 3 s of a synthetic tone sequence is sent. A plain client of the protocol (websockets, numpy, soundfile only:
it starts at once), paced in real time unless ``--fast``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys

import numpy as np
from websockets.asyncio.client import connect


def read_pcm16(path: str | None) -> tuple[np.ndarray, int]:
    """int16 mono samples and their rate (a file, or 3 s of tones at 16 kHz)."""
    if path is None:
        t = np.arange(3 * 16000) / 16000
        tones = 0.3 * np.sin(2 * np.pi * (200 + 150 * np.floor(t * 4)) * t)
        return np.round(tones * 32767).astype(np.int16), 16000
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
    parser.add_argument("audio", nargs="?", help="a mono WAV/FLAC file at the server's rate (default: tones)")
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--chunk-ms", type=float, default=80.0, help="audio per message")
    parser.add_argument("--fast", action="store_true", help="send as fast as the server reads (no real-time pacing)")
    args = parser.parse_args()
    pcm, rate = read_pcm16(args.audio)
    return asyncio.run(stream(args.url, pcm, rate, args.chunk_ms, args.fast, args.api_key))


if __name__ == "__main__":
    raise SystemExit(main())
