"""StreamingEngine against NeMo's cache-aware streaming script on each file alone (its ``--audio_file`` mode).

NeMo's script (``speech_to_text_cache_aware_streaming_infer.py``; its verbatim copy in ``fixtures/nemo_examples`` runs
here in-process: ``perform_streaming``) fills ``CacheAwareStreamingAudioBuffer`` with ``append_audio_file``. The
buffer's preprocessor (``pad_to: 0``) returns ``L // hop + 1`` STFT frames for ``L`` samples, the last one past
``seq_len = L // hop`` and masked to ``pad_value`` (0.0), and ``append_processed_signal`` takes the width, not
``seq_len``, as the stream's length. So the script streams one frame more than the file's features, which NeMo's
offline ``transcribe`` encodes and the engine streams by default (test_streaming_engine.py). Stepped as the stream's
last frame, it changes the encoder's last frames in three ways (measured at [16, 3]: first chunk 25 frames, then 32,
a later chunk under ``min_last_chunk`` = 8 frames dropped):

1. ``L // hop`` odd, the last chunk stepped: the causal subsampling sees it where it saw zero padding, and the last
   two encoder frames change;
2. ``L // hop % 8 == 1``, the last chunk stepped: one more encoder frame;
3. a last chunk of ``min_last_chunk - 1`` frames: NeMo's buffer drops it; with the frame it is stepped.

Any of them can change a stream's last tokens (more or fewer). ``StreamingEngine(masked_end_frame=True)`` steps that
frame too, and its final tokens equal the script's, whatever the pushes.

Not reproduced: the script's manifest mode, which streams a batch of files in one buffer. There a shorter file's last
chunk under ``min_last_chunk`` is stepped all the same (the buffer checks the chunk's width in the batch, not the
file's length), so a file's tokens depend on the other files of its batch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_streaming_model, whole_file_features
from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.streaming import StreamingEngine

pytestmark = pytest.mark.usefixtures("single_thread")

SCRIPT = Path(__file__).parent / "fixtures" / "nemo_examples" / "speech_to_text_cache_aware_streaming_infer.py"
ATT = [16, 3]
HOP = 160
# feature frames per stream (L // hop) at [16, 3], for the three ways above and around them: 224 (a last chunk of 7
# frames, 8 with NeMo's), 233 (L // hop % 8 == 1), 171, 235, 283 (odd), 250 (even), 25 (exactly a first chunk), 10
# (inside one), 0 (one sample: the script streams its masked frame alone); each with a few samples past its last hop
FRAMES = [224, 233, 171, 235, 283, 250, 25, 10, 0]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    model = tiny_streaming_model("tiny-rnnt-streaming")
    model.encoder.set_default_att_context_size(ATT)
    return model


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    """int16 PCM per stream, ``FRAMES[i] * HOP`` samples and 1 to 159 more."""
    rng = np.random.default_rng(3)
    lengths = [frames * HOP + int(rng.integers(1, HOP)) for frames in FRAMES]
    signals = S.synthetic_audio([n / 16000 + 0.01 for n in lengths], seed=13)
    return [np.round(s[:n] * 32768).astype(np.int16) for s, n in zip(signals, lengths, strict=True)]


@pytest.fixture(scope="module")
def wavs(audio, tmp_path_factory) -> list[Path]:
    return S.write_wavs([pcm.astype(np.float32) / 32768 for pcm in audio], tmp_path_factory.mktemp("script_wavs"))


def nemo_script():
    """The script's module, as its ``main`` leaves it for ``perform_streaming`` (fp32: autocast off)."""
    spec = importlib.util.spec_from_file_location("speech_to_text_cache_aware_streaming_infer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.autocast = torch.amp.autocast("cpu", enabled=False)
    return module


def script_finals(model, wavs: list[Path]) -> list[tuple[list[int], str]]:
    """NeMo's script on each file alone (``append_audio_file``, ``perform_streaming``): its final tokens and text."""
    script, step = nemo_script(), model.conformer_stream_step
    last: list = []

    def recording(*args, **kwargs):  # the hypotheses of the script's last step hold the stream's tokens
        out = step(*args, **kwargs)
        last[:] = out[5]
        return out

    model.conformer_stream_step = recording
    finals = []
    try:
        for path in wavs:
            buffer = CacheAwareStreamingAudioBuffer(model=model)
            buffer.append_audio_file(str(path), stream_id=-1)
            texts, _ = script.perform_streaming(asr_model=model, streaming_buffer=buffer)
            (hyp,) = last
            assert texts == [hyp.text]
            finals.append((as_int_list(hyp.y_sequence), hyp.text))
    finally:
        del model.conformer_stream_step  # the model's own method again
    return finals


@pytest.fixture(scope="module")
def script(model, wavs) -> list[tuple[list[int], str]]:
    finals = script_finals(model, wavs)
    assert sum(len(ids) for ids, _ in finals) > 0  # there is something to compare
    return finals


def engine_finals(model, audio, masked_end_frame: bool, seed: int | None = None) -> list[tuple[list[int], str]]:
    """The engine's final tokens and text per stream: pushed whole (``seed=None``), or in random pieces of 1-6000
    samples with polls in between, all streams at once."""
    engine = StreamingEngine(model, num_slots=len(audio), masked_end_frame=masked_end_frame)
    ids = [engine.open() for _ in audio]
    if seed is None:
        for stream_id, pcm in zip(ids, audio, strict=True):
            engine.push(stream_id, pcm)
    else:
        rng, sent = np.random.default_rng(seed), [0] * len(audio)
        while any(s < len(pcm) for s, pcm in zip(sent, audio, strict=True)):
            for i, (stream_id, pcm) in enumerate(zip(ids, audio, strict=True)):
                n = int(rng.integers(1, 6000))
                engine.push(stream_id, pcm[sent[i] : sent[i] + n].tobytes())
                sent[i] += n
            engine.poll()
    for stream_id in ids:
        engine.finish(stream_id)
    finals = {}
    while len(finals) < len(ids):
        finals.update({event.stream_id: event for event in engine.poll() if event.is_last})
    return [(finals[i].token_ids, finals[i].text) for i in ids]


def test_the_script_streams_the_masked_frame_past_the_features(model, audio, wavs):
    """The cause: the script's buffer holds each file's features and one frame of ``pad_value``, and streams it."""
    pad_value = float(model.preprocessor.featurizer.pad_value)
    for pcm, path in zip(audio, wavs, strict=True):
        buffer = CacheAwareStreamingAudioBuffer(model=model)
        buffer.append_audio_file(str(path), stream_id=-1)
        features = whole_file_features(model, pcm)  # [F, L // hop]
        assert features.shape[1] == len(pcm) // HOP
        assert buffer.streams_length.tolist() == [features.shape[1] + 1]
        assert torch.equal(buffer.buffer[0, :, :-1], features)
        assert (buffer.buffer[0, :, -1] == pad_value).all()


def test_the_masked_frame_changes_last_tokens_that_the_engine_reproduces(model, audio, script):
    # without the frame (the file's features), some of these streams end with other tokens than the script's
    default = engine_finals(model, audio, masked_end_frame=False)
    assert any(ours != theirs for ours, theirs in zip(default, script, strict=True))
    # with it, every stream's tokens and text are the script's, whatever the pushes
    assert engine_finals(model, audio, masked_end_frame=True) == script
    assert engine_finals(model, audio, masked_end_frame=True, seed=5) == script


def test_an_empty_stream_gets_no_masked_frame(model):
    engine = StreamingEngine(model, num_slots=1, masked_end_frame=True)
    event = engine.close(engine.open())
    assert event.is_last and event.token_ids == [] and event.text == ""


def test_masked_end_frame_must_be_a_bool(model):
    with pytest.raises(TypeError, match="masked_end_frame must be a bool, got 1"):
        StreamingEngine(model, num_slots=1, masked_end_frame=1)
