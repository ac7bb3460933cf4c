"""The vendored NeMo test files are pinned: byte for byte what their source commit holds, licence header included."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

HERE = Path(__file__).parent
VENDORED = HERE / "decoding"
NEMO_SPEECH_31 = ("yhayarannvidia/NeMo-Speech", "51ba7b98b88c4c751098540209e03672b30a3a95")
NEMO_SPEECH = ("NVIDIA-NeMo/Speech", "8b22cdc3ac222b2a6cda73c99476db9834e32733")
NEMO_DIR = "tests/collections/asr/decoding"

#: vendored file -> (source repository, commit, sha256 of the file); its path there is NEMO_DIR/<file>
SOURCES: dict[str, tuple[str, str, str]] = {
    "utils.py": (*NEMO_SPEECH_31, "c7cf14cedb630c047f733a55c379466df893f41b62abb1e0febb5914655caad1"),
    "test_timestamps.py": (*NEMO_SPEECH_31, "f07b97bafd7db6946345162b3ef5bd673befc81f39de8d28e4949b2df4c8bfa9"),
    "test_rnnt_decoding.py": (*NEMO_SPEECH_31, "21e44939a98561f1a3b119b6c4372e0dd63910b9aaf7d5f9385a2f8382e94b40"),
    "test_cuda_graph_rnnt_greedy_decoding.py": (
        *NEMO_SPEECH_31,
        "cf8556164826cb29a6871913c75bb8f1ce5017551662c625f9e19c202d20e250",
    ),
    "test_streaming_decoding.py": (*NEMO_SPEECH_31, "554e105cd973cabc39b424010f5789d98ddfdfb456f51bbf3c7901f4cf3d18cb"),
    "test_batched_beam_decoding.py": (
        *NEMO_SPEECH_31,
        "231527e44a7d8830806ef2aa665df8529fe2cda65857855200a5b87d8a6342ca",
    ),
    "test_batched_beam_zero_length.py": (
        *NEMO_SPEECH,
        "01d85eacd491fe5a4a7ecd41f559d2e5c54521f37f76e67ac634f900be93ed72",
    ),
}


def test_every_vendored_file_is_pinned():
    assert sorted(p.name for p in VENDORED.glob("*.py")) == sorted(SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_vendored_file_is_verbatim(name):
    data = (VENDORED / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SOURCES[name][2], (
        f"decoding/{name} differs from {SOURCES[name][0]}@{SOURCES[name][1]}:{NEMO_DIR}/{name}; vendored files are "
        "never edited: the substitution happens at collection time (upstream_substitution.py)"
    )
    header = data[:1000].decode()
    assert "NVIDIA CORPORATION" in header and "Licensed under the Apache License, Version 2.0" in header


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_readme_names_the_source(name):
    readme = (HERE / "README.md").read_text(encoding="utf8")
    repo, commit, _ = SOURCES[name]
    assert f"`{name}`" in readme and repo in readme and commit in readme
