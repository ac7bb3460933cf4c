"""Small ASR models trained on synthesised speech (``scripts/train_tiny_models.py``).

* :mod:`.vocabulary`, :mod:`.spoken_numbers`, :mod:`.corpus` -- a seeded English sentence grammar and its
  train / dev / test splits (held-out sentences in the training vocabulary).
* :mod:`.speech`, :mod:`.espeak_worker` -- eSpeak NG voices and speaking parameters, parallel, deterministic
  synthesis to 16 kHz WAV files, NeMo manifests.
* :mod:`.voices`, :mod:`.augment` -- other synthesisers (Festival for training, Flite held out for evaluation),
  augmentation (speed, pitch, room, channel, noise, level), pause-joined multi-utterance examples, evaluation splits.
* :mod:`.transducer_loss` -- RNN-T and TDT losses in PyTorch for any device, equal to NeMo's.
* :mod:`.training`, :mod:`.evaluation` -- NeMo's models trained on Lightning (resumable) and exported; held-out
  WER offline and cache-aware streaming.
* :mod:`.layout`, :mod:`.recipe` -- the output folder and the stages that fill it.
"""
