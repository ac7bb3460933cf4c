"""Offline stand-ins for what NeMo's decoding tests download: tiny synthetic models and synthetic "an4" audio.

NeMo's tests load pretrained checkpoints (``ASRModel.from_pretrained``) and the an4 test data
(``test_data.tar.gz``). Neither can be downloaded here or on CI, so every checkpoint name maps to a tiny
synthetic model of the same class and decoding type (:data:`STAND_INS`), built once per session with random
weights and a calibrated blank bias, and handed out as a fresh copy on every call, as a download would be.
The test data directory holds synthetic speech-like WAV files and manifests under NeMo's file names.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nemo.collections.asr.models import ASRModel
from omegaconf import open_dict

from fastdecode_lab import synthetic
from nemo_fastdecode.nemo.context import quiet_nemo

#: the two runs of every vendored test file (README.md)
REFERENCE, SUBSTITUTED = "reference", "substituted"
#: NeMo's strategies and ours (the same table as the string substitution, upstream_substitution.py)
STRATEGY = {REFERENCE: "greedy_batch", SUBSTITUTED: "fast_greedy"}


@dataclass(frozen=True)
class StandIn:
    """The synthetic model that replaces one pretrained checkpoint."""

    preset: str
    vocab: str
    seed: int
    note: str


#: checkpoint name -> synthetic stand-in (same model class and decoding type; README.md lists the differences).
#: Seeds: the utterances NeMo's tests pick by name (cen3-fjlp-b, cen3-mjwl-b) get non-empty greedy transcripts, as
#: real speech would (random RNN-T models emit nothing on some utterances), and the parakeet stand-in none of the last
#: len(durations) token ids (NeMo 3.0.0's char TDT decoding cannot spell them).
STAND_INS: dict[str, StandIn] = {
    "stt_en_conformer_transducer_small": StandIn("tiny-rnnt", "bpe", 6, "EncDecRNNTBPEModel, RNN-T"),
    "stt_en_fastconformer_transducer_large": StandIn("tiny-rnnt", "bpe", 4, "EncDecRNNTBPEModel, RNN-T"),
    "nvidia/stt_en_fastconformer_tdt_large": StandIn("tiny-tdt", "bpe", 0, "EncDecRNNTBPEModel, TDT"),
    # a hybrid TDT-CTC model in NeMo; no synthetic preset combines TDT with the CTC head, and the tests that load
    # it use only its transducer decoder, joint, tokenizer and decoding config
    "nvidia/parakeet-tdt_ctc-110m": StandIn("tiny-tdt", "bpe", 1, "EncDecRNNTBPEModel, TDT (NeMo's is hybrid)"),
}

#: checkpoints with no stand-in: the tests that load them are skipped with this reason
NO_STAND_IN = {
    "nvidia/stt_en_conformer_ctc_small": "a CTC model: not a transducer, none of our strategies applies",
    "nvidia/canary-180m-flash": "an AED (Canary) model: not a transducer, none of our strategies applies",
}

# synthetic "an4": NeMo's tests name two of its files; durations are an4-like (short commands and numbers)
AN4_NAMES = ("cen3-fjlp-b", "cen3-mjwl-b", *(f"synthetic-{i:02d}" for i in range(2, 10)))
AN4_DURATIONS = (2.6, 1.9, 3.1, 1.4, 2.2, 3.4, 1.7, 2.9, 2.0, 2.4)
AN4_VAL = 6  # the first six files form the validation manifest (the streaming tests need more than one batch of 4)
TOKENS_PER_FRAME = 0.3  # the emission rate of trained Parakeet models (DESIGN.md)


def write_test_data(root: Path) -> Path:
    """NeMo's ``test_data_dir`` layout with synthetic audio: ``asr/test/an4/wav/*.wav`` and the an4 manifests."""
    wav_dir = root / "asr" / "test" / "an4" / "wav"
    audio = synthetic.synthetic_audio(AN4_DURATIONS, seed=7)
    paths = []
    for name, path in zip(AN4_NAMES, synthetic.write_wavs(audio, wav_dir), strict=True):
        paths.append(path.rename(wav_dir / f"{name}.wav"))
    synthetic.write_manifest(paths[:AN4_VAL], AN4_DURATIONS[:AN4_VAL], root / "asr" / "an4_val.json")
    synthetic.write_manifest(paths[AN4_VAL:], AN4_DURATIONS[AN4_VAL:], root / "asr" / "an4_train.json")
    return root


class ModelStandIns:
    """Builds each stand-in once (random weights, blank bias calibrated on the synthetic an4 audio), hands out copies."""

    def __init__(self):
        self._audio = synthetic.synthetic_audio(AN4_DURATIONS, seed=7)
        self._prototypes: dict[str, ASRModel] = {}
        self._shared: dict[tuple[str, str], ASRModel] = {}

    def prototype(self, name: str) -> ASRModel:
        if name in NO_STAND_IN:
            pytest.skip(f"{name}: {NO_STAND_IN[name]}")
        if name not in STAND_INS:
            raise LookupError(
                f"no synthetic stand-in for pretrained model {name!r} (tests/nemo_upstream/upstream_stand_ins.py); "
                f"known: {', '.join(sorted(STAND_INS))}"
            )
        if name not in self._prototypes:
            spec = STAND_INS[name]
            model = synthetic.build_synthetic_model(spec.preset, vocab=spec.vocab, seed=spec.seed)
            encoded, lengths = synthetic.encode(model, self._audio, batch_size=len(self._audio), device="cpu")
            synthetic.calibrate_blank_bias(model, encoded, lengths, TOKENS_PER_FRAME, tolerance=0.03)
            self._prototypes[name] = model
        return self._prototypes[name]

    def model(self, name: str, variant: str) -> ASRModel:
        """A fresh copy of the stand-in for ``name``; its default strategy is NeMo's (reference) or ours (substituted)."""
        prototype = self.prototype(name)
        with quiet_nemo():
            model = type(prototype)(cfg=copy.deepcopy(prototype.cfg))
            model.load_state_dict(prototype.state_dict())
            # the BPE tokenizer's files live in the prototype's temporary directory: keep it alive with the copy
            model._synthetic_tokenizer_tmpdir = getattr(prototype, "_synthetic_tokenizer_tmpdir", None)
            if variant == SUBSTITUTED:
                decoding_cfg = copy.deepcopy(model.cfg.decoding)
                with open_dict(decoding_cfg):
                    decoding_cfg.strategy = STRATEGY[SUBSTITUTED]
                model.change_decoding_strategy(decoding_cfg, verbose=False)
        model.eval()
        return model

    def shared(self, name: str, variant: str) -> ASRModel:
        """One copy per ``(name, variant)`` for the whole session, as NeMo's package-scoped model fixtures."""
        if (name, variant) not in self._shared:
            self._shared[name, variant] = self.model(name, variant)
        return self._shared[name, variant]


@contextlib.contextmanager
def offline_pretrained(stand_ins: ModelStandIns, variant: str) -> Iterator[None]:
    """``ASRModel.from_pretrained`` returns stand-ins (for ``variant``) instead of downloading, while a test runs."""

    def from_pretrained(cls, model_name: str, *args, map_location=None, **kwargs):
        model = stand_ins.model(model_name, variant)
        return model.to(map_location) if map_location is not None else model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ASRModel, "from_pretrained", classmethod(from_pretrained))
        yield
