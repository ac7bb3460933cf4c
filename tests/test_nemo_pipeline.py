"""NeMo's streaming inference entry point selects the engine by configuration: ``pipeline_type: fast_cache_aware``.

NeMo's config (``tests/fixtures/nemo_streaming``: ``cache_aware_rnnt.yaml``'s settings) with that one line changed,
NeMo's ``PipelineBuilder.build_pipeline`` and ``pipeline.run`` on WAV files of a tiny cache-aware model saved as a
``.nemo``: the transcripts equal NeMo's cache-aware streaming of each file alone (the engine's reference), and the
files NeMo's streaming script writes (``dump_output``) have the format they have with NeMo's own pipeline. The
script's steps also run in a fresh process that imports nothing from ``nemo_fastdecode``: the start-up hook
(``autoload/``) is what routes the builder to us.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import nemo_alone
from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions
from nemo.collections.asr.inference.utils.manifest_io import dump_output, prepare_audio_data
from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig
from nemo.collections.asr.parts.context_biasing.biasing_multi_model import BiasingRequestItemConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from fastdecode_lab import synthetic as S
from nemo_fastdecode.greedy.nemo_computer import NemoDecodingComputer
from nemo_fastdecode.nemo import registry
from nemo_fastdecode.nemo.streaming_pipeline import FastCacheAwarePipeline

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = Path(__file__).parent / "fixtures" / "nemo_streaming" / "cache_aware_rnnt.yaml"
DURATIONS = [1.9, 0.75, 2.6]
ATT = [16, 3]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """A tiny cache-aware hybrid (BPE: NeMo's pipeline decodes subwords) as a .nemo, 3 WAVs, a manifest, and each
    file's transcript by NeMo's cache-aware streaming of that file alone."""
    root = tmp_path_factory.mktemp("nemo_pipeline")
    model = S.build_synthetic_model("tiny-streaming", seed=0, vocab="bpe")
    encoded, lengths = S.encode(model, S.synthetic_audio([2.0, 1.5], seed=7), batch_size=2, device="cpu")
    S.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    model.save_to(str(root / "model.nemo"))
    audio = S.synthetic_audio(DURATIONS, seed=11)
    wavs = [str(p) for p in S.write_wavs(audio, root / "wavs")]
    S.write_manifest(wavs, DURATIONS, root / "manifest.json")
    model.encoder.set_default_att_context_size(ATT)
    alone = {}
    for wav, samples in zip(wavs, audio, strict=True):
        signal = torch.from_numpy(samples)[None]
        with torch.inference_mode():
            feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
        _, hyp, _ = nemo_alone(model, feats[0, :, : int(length)])
        alone[wav] = hyp.text
    assert any(alone.values())  # there is something to compare
    return {"root": root, "wavs": wavs, "alone": alone, "model": model, "audio": audio}


def nemo_config(saved: dict, *overrides: str) -> DictConfig:
    """NeMo's config on the CPU for the tiny model: the example's values, a local .nemo, fp32, 2 streams at a time."""
    cfg = OmegaConf.load(CONFIG)
    cpu = [
        f"asr.model_name={saved['root'] / 'model.nemo'}", "asr.device=cpu", "asr.compute_dtype=float32",
        f"streaming.att_context_size=[{ATT[0]},{ATT[1]}]", "streaming.batch_size=2", "streaming.num_slots=2",
        "matmul_precision=highest", "log_level=40",
    ]  # fmt: skip
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([*cpu, *overrides]))


def test_the_builder_returns_our_pipeline_and_its_transcripts_are_nemo_streaming_alone(saved):
    pipeline = PipelineBuilder.build_pipeline(nemo_config(saved, "pipeline_type=fast_cache_aware"))
    assert isinstance(pipeline, FastCacheAwarePipeline)
    output = pipeline.run(saved["wavs"])  # 3 files, 2 streams at a time: the third joins when the second ends
    assert sorted(output) == [0, 1, 2]
    for record in output.values():
        assert record["text"] == saved["alone"][record["audio_filepath"]]
        (segment,) = record["segments"]  # one final transcript per stream, NeMo's TextSegment
        assert segment.text == record["text"] and 0 <= segment.start < segment.end <= 2.7
    words = pipeline.run(saved["wavs"], options=[ASRRequestOptions(asr_output_granularity="word")] * 3)
    for record in words.values():
        text = " ".join(w.text for w in record["segments"])
        assert text == record["text"] == saved["alone"][record["audio_filepath"]]
        assert all(type(w).__name__ == "Word" and w.start < w.end for w in record["segments"])
    assert pipeline.engine.open_streams == []  # every stream ended in the engine too


def biasing(phrases, **tree) -> BiasingRequestItemConfig | None:
    if phrases is None and not tree:
        return None
    cfg = BoostingTreeModelConfig(key_phrases_list=phrases, **tree)
    return BiasingRequestItemConfig(boosting_model_cfg=cfg, boosting_model_alpha=4.0)


def test_per_stream_biasing_requests_are_the_streams_boosting_trees(saved):
    """``enable_per_stream_biasing: true``: each request's ``biasing_cfg`` is its stream's boosting tree; the
    transcripts equal NeMo's per-stream biasing of each file alone (``nemo_alone`` with the request's config, NeMo's
    decoding with ``enable_per_stream_biasing``). Without the flag the requests are ignored with a warning, as NeMo's
    pipeline ignores them; NeMo's options the engine does not take are refused by name."""
    phrases = [["the quick", "brown"], None, ["weeneen", "ack"]]
    model = saved["model"]
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.strategy = "greedy_batch"
        cfg.greedy.loop_labels, cfg.greedy.use_cuda_graph_decoder, cfg.greedy.enable_per_stream_biasing = (
            True,
            False,
            True,
        )
    model.change_decoding_strategy(cfg, decoder_type="rnnt", verbose=False)
    boosted = {}
    for wav, samples, words in zip(saved["wavs"], saved["audio"], phrases, strict=True):
        signal = torch.from_numpy(samples)[None]
        with torch.inference_mode():
            feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
        boosted[wav] = nemo_alone(model, feats[0, :, : int(length)], biasing(words))[1].text
    assert [w for w in saved["wavs"] if boosted[w] != saved["alone"][w]], "boosting changes nothing: cannot fail"
    options = [ASRRequestOptions(biasing_cfg=biasing(words)) for words in phrases]
    on = "asr.decoding.greedy.enable_per_stream_biasing=true"
    pipeline = PipelineBuilder.build_pipeline(nemo_config(saved, "pipeline_type=fast_cache_aware", on))
    output = pipeline.run(saved["wavs"], options=options)
    assert {r["audio_filepath"]: r["text"] for r in output.values()} == boosted
    with pytest.raises(ValueError, match="key_phrases_file"):
        pipeline.run(saved["wavs"][:1], options=[ASRRequestOptions(biasing_cfg=biasing(None, key_phrases_file="x"))])
    off = PipelineBuilder.build_pipeline(nemo_config(saved, "pipeline_type=fast_cache_aware"))
    with pytest.warns(UserWarning, match="enable_per_stream_biasing is false: ignored"):
        output = off.run(saved["wavs"], options=[ASRRequestOptions(biasing_cfg=biasing(w)) for w in phrases])
    assert {r["audio_filepath"]: r["text"] for r in output.values()} == saved["alone"]


def test_nemos_own_cache_aware_pipeline_with_fast_greedy_applies_per_stream_biasing(saved):
    """NeMo's ``CacheAwareRNNTPipeline`` (``pipeline_type: cache_aware``) with ``strategy: fast_greedy`` and
    ``enable_per_stream_biasing: true``: the pipeline adds each request's tree to the decoding computer's
    ``biasing_multi_model`` and the streams are boosted as with ``greedy_batch``; the same transcripts, with and
    without phrases, and every tree leaves the multi-model at its stream's end."""
    phrases = [["the quick", "brown"], None, ["weeneen", "ack"]]
    on = "asr.decoding.greedy.enable_per_stream_biasing=true"
    texts = {}
    for strategy in ("greedy_batch", "fast_greedy"):
        pipeline = PipelineBuilder.build_pipeline(nemo_config(saved, f"asr.decoding.strategy={strategy}", on))
        assert not isinstance(pipeline, FastCacheAwarePipeline)
        computer = pipeline.asr_model.asr_model.decoding.decoding.decoding_computer
        assert computer.per_stream_biasing_enabled
        assert isinstance(computer, NemoDecodingComputer) == (strategy == "fast_greedy")
        for boosted in (False, True):
            options = [ASRRequestOptions(biasing_cfg=biasing(words) if boosted else None) for words in phrases]
            output = pipeline.run(saved["wavs"], options=options)
            texts[strategy, boosted] = {r["audio_filepath"]: r["text"] for r in output.values()}
        multi = computer.biasing_multi_model  # NeMo's removal frees a tree's id, num_models stays
        assert multi.num_models > 0 and multi.free_ids == set(range(multi.num_models))
    assert any(texts["greedy_batch", True].values()), "no text: the comparison could not fail"
    assert texts["greedy_batch", True] != texts["greedy_batch", False], "boosting changes nothing: cannot fail"
    assert texts["fast_greedy", True] == texts["greedy_batch", True]
    assert texts["fast_greedy", False] == texts["greedy_batch", False]


def test_an_ngram_lm_in_the_decoding_config_is_fused_as_nemo_fuses_it(saved, tmp_path):
    """``asr.decoding.greedy.ngram_lm_model`` / ``ngram_lm_alpha``: the engine fuses the LM; the transcripts equal
    NeMo's cache-aware streaming of each file alone with the same LM (``nemo_alone``, NeMo's greedy_batch fusing it)."""
    from fastdecode_lab.fusion_models import write_arpa

    model = saved["model"]
    lm = tmp_path / "lm.arpa"
    write_arpa(lm, vocab_size=int(model.decoding.blank_id), shares=(0.2, 0.1), seed=3)
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.strategy = "greedy_batch"
        cfg.greedy.loop_labels, cfg.greedy.use_cuda_graph_decoder = True, False
        cfg.greedy.enable_per_stream_biasing = False
        cfg.greedy.ngram_lm_model, cfg.greedy.ngram_lm_alpha = str(lm), 2.0
    model.change_decoding_strategy(cfg, decoder_type="rnnt", verbose=False)
    fused = {}
    for wav, samples in zip(saved["wavs"], saved["audio"], strict=True):
        signal = torch.from_numpy(samples)[None]
        with torch.inference_mode():
            feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
        fused[wav] = nemo_alone(model, feats[0, :, : int(length)])[1].text
    assert [w for w in saved["wavs"] if fused[w] != saved["alone"][w]], "the LM changes nothing: cannot fail"
    lm_settings = [f"asr.decoding.greedy.ngram_lm_model={lm}", "asr.decoding.greedy.ngram_lm_alpha=2.0"]
    pipeline = PipelineBuilder.build_pipeline(nemo_config(saved, "pipeline_type=fast_cache_aware", *lm_settings))
    output = pipeline.run(saved["wavs"])
    assert {r["audio_filepath"]: r["text"] for r in output.values()} == fused


def test_settings_the_engine_does_not_have_are_refused_by_name(saved):
    for override, error, name in [
        ("asr_decoding_type=ctc", ValueError, "asr_decoding_type"),
        ("asr.decoding.strategy=malsd_batch", ValueError, "malsd_batch"),
        ("enable_itn=true", NotImplementedError, "enable_itn"),
        ("streaming.request_type=feature_buffer", ValueError, "request_type"),
    ]:
        with pytest.raises(error, match=name):  # before the model loads
            PipelineBuilder.build_pipeline(nemo_config(saved, "pipeline_type=fast_cache_aware", override))
    autoload = __import__("nemo_fastdecode_autoload")
    assert autoload.constants()["FAST_PIPELINE_TYPE"] == registry.FAST_PIPELINE_TYPE  # one value, two readers


# The steps of NeMo 3.0.0's asr_streaming_infer.py, with NeMo's functions only (no nemo_fastdecode import here)
SCRIPT_STEPS = textwrap.dedent(
    """
    import sys
    from omegaconf import OmegaConf
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
    from nemo.collections.asr.inference.utils.manifest_io import calculate_duration, dump_output, prepare_audio_data
    from nemo.collections.asr.inference.utils.progressbar import TQDMProgressBar

    cfg = OmegaConf.merge(OmegaConf.load(sys.argv[1]), OmegaConf.from_dotlist(sys.argv[2:]))
    audio_filepaths, manifest, options, filepath_order = prepare_audio_data(cfg.audio_file, sort_by_duration=True)
    pipeline = PipelineBuilder.build_pipeline(cfg)
    output = pipeline.run(audio_filepaths, progress_bar=TQDMProgressBar(), options=options)
    calculate_duration(audio_filepaths)
    dump_output(output, cfg.output_filename, cfg.output_dir, manifest, filepath_order)
    print(type(pipeline).__name__, "nemo_fastdecode" in sys.modules)
    """
)


def written(output_filename: Path) -> tuple[list[dict], list[list[dict]]]:
    """The output manifest's records and, per record, the lines of its segments file."""
    records = [json.loads(line) for line in output_filename.read_text().splitlines()]
    return records, [[json.loads(line) for line in Path(r["json_filepath"]).read_text().splitlines()] for r in records]


def test_nemo_streaming_script_steps_in_a_fresh_process_write_nemo_format(saved, tmp_path):
    manifest = str(saved["root"] / "manifest.json")
    ours_file = tmp_path / "ours" / "out.jsonl"
    ours_file.parent.mkdir()
    overrides = [
        f"asr.model_name={saved['root'] / 'model.nemo'}", "asr.device=cpu", "asr.compute_dtype=float32",
        f"streaming.att_context_size=[{ATT[0]},{ATT[1]}]", "streaming.batch_size=2", "streaming.num_slots=2",
        "matmul_precision=highest", "log_level=40", f"audio_file={manifest}", f"output_filename={ours_file}",
        "pipeline_type=fast_cache_aware",
    ]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_STEPS, str(CONFIG), *overrides],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.split()[-2:] == ["FastCacheAwarePipeline", "True"]  # the hook imported us, on demand
    ours, our_segments = written(ours_file)
    assert [r["pred_text"] for r in ours] == [saved["alone"][r["audio_filepath"]] for r in ours]

    # NeMo's own pipeline, in the same steps: the same files with the same fields
    cfg = nemo_config(saved)
    files, entries, options, order = prepare_audio_data(manifest, sort_by_duration=True)
    nemo_file = tmp_path / "nemo" / "out.jsonl"
    nemo_file.parent.mkdir()
    output = PipelineBuilder.build_pipeline(cfg).run(files, options=options)
    dump_output(output, str(nemo_file), None, entries, order)
    theirs, their_segments = written(nemo_file)
    assert [r["audio_filepath"] for r in ours] == [r["audio_filepath"] for r in theirs]
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]
    lines = [line for segments in our_segments + their_segments for line in segments]
    assert lines and {tuple(sorted(line)) for line in lines} == {("conf", "end", "start", "text")}
