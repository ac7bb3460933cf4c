"""The ``trained`` calibration of synthetic models: a trained model's rate and burst length, decoded exactly."""

from __future__ import annotations

import pytest
import torch

from fastdecode_lab import synthetic as S
from fastdecode_lab.emissions import EmissionStats, emission_stats, trained_emission_stats
from nemo_fastdecode.apps.comparison import agreement, decode_all
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer


def _encoded(model, seconds: float = 30.0):
    audio = S.synthetic_audio(S.librispeech_like_durations(total_seconds=seconds, seed=0), seed=0)
    return S.encode(model, audio, batch_size=8, device="cpu")


def _nemo_stats(model, encoded, lengths) -> EmissionStats:
    decoder = S.nemo_baseline_greedy(model)
    hyps = decode_all(decoder, list(zip(encoded, lengths, strict=True)))
    return emission_stats(hyps, [int(n) for lens in lengths for n in lens])


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "kind"), [("tiny-rnnt", "rnnt"), ("tiny-tdt", "tdt")])
def test_reaches_the_trained_rate_and_bursts_and_decodes_exactly(preset, kind, single_thread):
    target = trained_emission_stats(kind)
    plain = S.build_synthetic_model(preset, seed=0)
    encoded, lengths = _encoded(plain)
    S.calibrate_blank_bias(plain, encoded, lengths, target.tokens_per_frame)
    plain_stats = _nemo_stats(plain, encoded, lengths)

    model = S.build_synthetic_model(preset, seed=0)
    result = S.calibrate_trained_like(model, encoded, lengths)
    assert result.target == target
    achieved = _nemo_stats(model, encoded, lengths)
    assert achieved.tokens > 0
    assert achieved.tokens_per_frame == pytest.approx(result.achieved.tokens_per_frame)  # the model kept is the one
    assert achieved.tokens_per_frame == pytest.approx(target.tokens_per_frame, rel=0.2)
    assert achieved.tokens_per_emitting_frame == pytest.approx(target.tokens_per_emitting_frame, rel=0.2)
    if kind == "rnnt":  # a random RNN-T model's bursts: several tokens per emitting frame at the same rate
        assert plain_stats.tokens_per_emitting_frame > 2.5 * achieved.tokens_per_emitting_frame
    assert achieved.emitting_frame_share > plain_stats.emitting_frame_share

    # our decoder sees the same model: the same tokens and frames as NeMo's baseline
    spec = S.transducer_spec(model)
    ours = FastGreedyBatchedInfer(
        decoder_model=model.decoder, joint_model=model.joint, blank_index=spec.blank_id, max_symbols_per_step=10,
        durations=spec.durations, loop_labels=True, graph_mode="eager",
    )  # fmt: skip
    batches = list(zip(encoded, lengths, strict=True))
    reference = decode_all(S.nemo_baseline_greedy(model), batches)
    assert agreement(reference, decode_all(ours, batches))[0] == 1.0


def test_gate_is_deterministic_and_reinstalling_it_overwrites_the_same_units():
    a, b = S.build_synthetic_model("tiny-rnnt", seed=0), S.build_synthetic_model("tiny-rnnt", seed=0)
    encoded, lengths = _encoded(a, seconds=8.0)
    from fastdecode_lab.synthetic.trained_like import install_consumption_gate

    install_consumption_gate(a, encoded, lengths, gate=2.0)
    install_consumption_gate(a, encoded, lengths, gate=16.0)
    install_consumption_gate(b, encoded, lengths, gate=16.0)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="tokens_per_emitting_frame >= 1"):
        S.calibrate_trained_like(a, encoded, lengths, EmissionStats(0.3, 0.5, 2.0))


@pytest.mark.parametrize("layers", [1, 2])
def test_sign_register_shows_the_last_tokens_sign_in_the_prediction_output(layers):
    from fastdecode_lab.synthetic.trained_like import _install_sign_register

    model = S.build_synthetic_model("tiny-rnnt", seed=0)
    rnn = model.decoder.prediction["dec_rnn"]
    if layers != rnn.lstm.num_layers:  # Parakeet TDT's prediction network has two layers
        torch.manual_seed(0)
        rnn.lstm = torch.nn.LSTM(rnn.lstm.input_size, rnn.lstm.hidden_size, num_layers=layers)
    signs, probe = _install_sign_register(model, seed=3)
    vocab = signs.shape[0]
    assert int((signs > 0).sum()) == vocab // 2 + vocab % 2 and set(signs.tolist()) == {-1.0, 1.0}
    tokens = torch.randint(0, vocab, (16, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        g, _ = model.decoder.predict(tokens, state=None, add_sos=True, batch_size=16)  # [16, 13, H]
    read = g @ probe[:-1] + probe[-1]
    assert torch.allclose(read[:, 0], torch.zeros(16), atol=1e-3)  # nothing emitted yet
    assert torch.equal(torch.sign(read[:, 1:]), signs[tokens])
    assert torch.allclose(read[:, 1:].abs(), torch.ones(16, 12), rtol=1e-3)
