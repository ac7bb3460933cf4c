"""NeMo's own decoding tests, run twice: as NeMo wrote them (reference) and with our strategies substituted.

README.md in this directory says where each vendored file comes from and what is changed. Here:

* every ``decoding/test_*.py`` is collected twice: ``<file>::reference::...`` (the file as it is) and
  ``<file>::substituted::...`` (the mechanical substitution of :mod:`upstream_substitution`);
* NeMo's fixtures (its ``tests/conftest.py`` and ``tests/collections/asr/decoding/conftest.py``) are replaced by
  offline ones: synthetic test data and tiny synthetic models (:mod:`upstream_stand_ins`); NeMo's
  ``tests.collections.asr.decoding`` package resolves to the vendored files;
* :data:`EXPECTED` is the one table of tests that cannot pass here, each with its reason: skipped (needs real
  speech, NeMo's test data or a GPU-only NeMo feature), or ``xfail(strict=True)`` (a feature still missing from our
  strategies, or a NeMo 3.0.0 bug) so that the day it passes, the table must change.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from . import upstream_stand_ins as stand_ins
from . import upstream_substitution
from .upstream_substitution import VARIANT_ATTRIBUTE, load_substituted_module

HERE = Path(__file__).parent
VENDORED = HERE / "decoding"
NEMO_PACKAGE = "tests.collections.asr.decoding"  # where NeMo's test files import each other from
#: no single vendored test may run longer than this (seconds); a hang fails the test instead of the CI job
TIME_LIMIT_S = 300

# --- what cannot pass here, and why (README.md explains each reason) ---
SKIP, XFAIL = "skip", "xfail"

GRAPH_MODES = (
    "intended: our graph modes are forced with greedy.graph_mode, not decoding_computer.force_cuda_graphs_mode "
    "(NeMo's computer's switch)"
)
# intended differences (not planned)
BEAM_GRAPH_MODES = "intended: fast_beam has no decoding_computer.force_cuda_graphs_mode (ours: beam.graph_mode)"
# NeMo 3.0.0 fails the later NeMo test that is vendored here (ours passes where it is substituted)
NEMO_300_ZERO_LENGTH = "NeMo 3.0.0 bug: malsd_batch decodes labels for rows with encoded_lengths == 0 (fixed later)"
NEMO_300_FINISHED_STREAM = "NeMo 3.0.0 bug: malsd_batch keeps decoding a stream whose length drops to 0 (fixed later)"
NEMO_300_TDT_DURATIONS = (
    "NeMo 3.0.0 bug: greedy_batch TDT token durations depend on the other utterances in the batch (fixed later)"
)
NEMO_300_STREAM_RESTORE = (
    "NeMo 3.0.0 bug: with_conditional_node does not restore the previous CUDA stream when the body raises (fixed later)"
)
# cannot run meaningfully here
NEEDS_WPE = "needs NeMo's an4 WPE tokenizer (test data) and HuggingFace's bert-base-cased: not available offline"
NEEDS_REAL_BPE = (
    "its expected word offsets are written for the real stt_en_conformer_transducer_small tokenizer "
    "(pieces 'discuss', 'friend'...); a synthetic tokenizer lacks them"
)
NEEDS_KENLM = "needs NeMo's KenLM test model (test data): not available offline"
NEEDS_REAL_SPEECH = "asserts what only a trained model on real speech does ({}); a random model need not"
NEEDS_CTC = "a CTC model's beam search: not a transducer, no strategy of ours stands in for it"
NOT_SUBSTITUTED = "nothing to substitute ({}): the substituted run would repeat the reference run"
PLEASEFIXME = "NeMo marks it pleasefixme: NeMo's CI does not run it"

#: node-id pattern (relative to decoding/, ``*`` matches anything) -> (outcome, reason); the first match wins.
#: ``*::`` patterns apply to both runs. XFAIL is strict: a test that starts passing fails until its row goes.
EXPECTED: dict[str, tuple[str, str]] = {
    # test_rnnt_decoding.py
    "test_rnnt_decoding.py::*::TestRNNTDecoding::test_constructor_subword": (SKIP, NEEDS_WPE),
    "test_rnnt_decoding.py::*::TestRNNTTimestamps::test_word_offsets_subword_wpe*": (SKIP, NEEDS_WPE),
    "test_rnnt_decoding.py::*::TestRNNTTimestamps::test_word_offsets_subword_bpe*": (SKIP, NEEDS_REAL_BPE),
    "test_rnnt_decoding.py::*::test_tdt_greedy_decoding[*-*-True-*]": (SKIP, NEEDS_KENLM),
    "test_rnnt_decoding.py::*::test_tdt_beam_decoding_with_kenlm*": (SKIP, NEEDS_KENLM),
    "test_rnnt_decoding.py::reference::*::test_rnnt_beam_decoding_preserve_alignments[beam_config0]": (
        SKIP,
        NEEDS_REAL_SPEECH.format("every frame ends with a blank before max_symbols is reached"),
    ),
    "test_rnnt_decoding.py::reference::*::test_rnnt_beam_decoding_preserve_alignments[beam_config2]": (
        SKIP,
        NEEDS_REAL_SPEECH.format("alsd keeps fewer hypotheses than half the frames"),
    ),
    "test_rnnt_decoding.py::reference::*::test_tdt_greedy_batched_token_duration_is_batch_invariant*": (
        XFAIL,
        NEMO_300_TDT_DURATIONS,
    ),
    "test_rnnt_decoding.py::substituted::*::test_greedy_decoding_preserve_alignments": (
        SKIP,
        NOT_SUBSTITUTED.format("NeMo's non-batched GreedyRNNTInfer"),
    ),
    "test_rnnt_decoding.py::substituted::*::test_rnnt_beam_decoding_preserve_alignments*": (
        SKIP,
        NOT_SUBSTITUTED.format("NeMo's non-batched BeamRNNTInfer"),
    ),
    "test_rnnt_decoding.py::substituted::*_decoding_compute_timestamps*": (
        SKIP,
        NOT_SUBSTITUTED.format("strategies greedy, beam, alsd"),
    ),
    "test_rnnt_decoding.py::substituted::*::test_tdt_beam_decoding*": (
        SKIP,
        NOT_SUBSTITUTED.format("NeMo's non-batched BeamTDTInfer"),
    ),
    # test_batched_beam_decoding.py
    "test_batched_beam_decoding.py::*::TestCTCDecoding::*": (SKIP, NEEDS_CTC),
    "test_batched_beam_decoding.py::*_kenlm*": (SKIP, NEEDS_KENLM),
    "test_batched_beam_decoding.py::substituted::*[*-beam_config2]": (SKIP, NOT_SUBSTITUTED.format("maes_batch")),
    "test_batched_beam_decoding.py::substituted::TestTransducerCudaGraphBeamDecoding::*": (XFAIL, BEAM_GRAPH_MODES),
    # test_batched_beam_zero_length.py
    "test_batched_beam_zero_length.py::reference::test_malsd_batch_zero_length_utterance_decodes_nothing*": (
        XFAIL,
        NEMO_300_ZERO_LENGTH,
    ),
    "test_batched_beam_zero_length.py::reference::test_malsd_batch_finished_stream_gains_no_labels*": (
        XFAIL,
        NEMO_300_FINISHED_STREAM,
    ),
    # test_cuda_graph_rnnt_greedy_decoding.py
    "test_cuda_graph_rnnt_greedy_decoding.py::reference::test_conditional_node_restores_previous_stream_on_body_error": (
        XFAIL,
        NEMO_300_STREAM_RESTORE,
    ),
    "test_cuda_graph_rnnt_greedy_decoding.py::substituted::test_forced_full_graph_compile_does_not_fallback": (
        SKIP,
        NOT_SUBSTITUTED.format("NeMo's CUDA-graph helpers"),
    ),
    "test_cuda_graph_rnnt_greedy_decoding.py::substituted::test_conditional_node_restores_previous_stream_on_body_error": (
        SKIP,
        NOT_SUBSTITUTED.format("NeMo's CUDA-graph helpers"),
    ),
    "test_cuda_graph_rnnt_greedy_decoding.py::*::test_loop_labels_cuda_graph_ddp_mixed_precision*": (
        SKIP,
        NEEDS_REAL_SPEECH.format("validation WER <= 0.1"),
    ),
    "test_cuda_graph_rnnt_greedy_decoding.py::substituted::test_loop_labels_cuda_graph_rnnt_greedy_decoder_forced_mode*": (
        XFAIL,
        GRAPH_MODES,
    ),
}

#: node-id pattern -> why the substituted run does not compare our hypotheses with NeMo's: NeMo 3.0.0 is wrong
#: there, and NeMo's own assertion (which NeMo 3.0.0 fails in the reference run) checks ours instead
NEMO_IS_WRONG: dict[str, str] = {
    "test_rnnt_decoding.py::substituted::*::test_tdt_greedy_batched_token_duration_is_batch_invariant*": (
        NEMO_300_TDT_DURATIONS
    ),
    "test_batched_beam_zero_length.py::substituted::test_malsd_batch_zero_length_utterance_decodes_nothing*": (
        NEMO_300_ZERO_LENGTH
    ),
}


def _key(item: pytest.Item) -> str:
    """``test_rnnt_decoding.py::substituted::TestRNNTDecoding::test_constructor`` for a vendored item."""
    return item.path.name + item.nodeid.split(".py", 1)[1]


def _matches(pattern: str, key: str) -> bool:
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), key) is not None


def _first_match(table: dict, key: str):
    return next((value for pattern, value in table.items() if _matches(pattern, key)), None)


def _is_vendored(item: pytest.Item) -> bool:
    return VENDORED in Path(item.path).parents


def _variant(node) -> str:
    module = getattr(node, "module", None)
    return getattr(module, VARIANT_ATTRIBUTE, stand_ins.REFERENCE)


# --- NeMo's package layout: `from tests.collections.asr.decoding.utils import ...` finds the vendored files ---


class _VendoredNeMoTests(importlib.abc.MetaPathFinder):
    """Resolves ``tests.collections.asr.decoding`` (and its parents, where nothing else provides them) to
    namespace packages whose only location is the vendored directory; consulted after every other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NEMO_PACKAGE and not NEMO_PACKAGE.startswith(fullname + "."):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = [str(VENDORED)] if fullname == NEMO_PACKAGE else []
        return spec


if not any(isinstance(finder, _VendoredNeMoTests) for finder in sys.meta_path):
    sys.meta_path.append(_VendoredNeMoTests())

from tests.collections.asr.decoding.utils import preserve_decoding_cfg_and_cpu_device  # noqa: E402

# --- collection: each vendored test file twice ---


class _VariantModule(pytest.Module):
    """A vendored test file in one variant; its node id is ``<file>::<variant>``."""

    variant = stand_ins.REFERENCE

    @classmethod
    def for_file(cls, parent, path: Path):
        rel = path.relative_to(parent.config.rootpath).as_posix()
        module = cls.from_parent(parent, path=path, name=f"{path.name}[{cls.variant}]", nodeid=f"{rel}::{cls.variant}")
        module.extra_keyword_matches.add(cls.variant)
        return module


class ReferenceModule(_VariantModule):
    """NeMo's file as it is: imported by pytest (with its assertion rewriting) under its own name."""


class SubstitutedModule(_VariantModule):
    """NeMo's file with our strategies substituted (upstream_substitution.py)."""

    variant = stand_ins.SUBSTITUTED

    def _getobj(self):
        return load_substituted_module(self.path, self.variant, self.config)


def _is_vendored_test_file(path: Path) -> bool:
    return path.parent == VENDORED and path.name.startswith("test_") and path.suffix == ".py"


def pytest_pycollect_makemodule(module_path: Path, parent):
    if _is_vendored_test_file(module_path):
        return ReferenceModule.for_file(parent, module_path)
    return None


@pytest.hookimpl(trylast=True)
def pytest_collect_file(file_path: Path, parent):
    if _is_vendored_test_file(file_path):
        return SubstitutedModule.for_file(parent, file_path)
    return None


def pytest_configure(config):
    # NeMo's markers (its tests/conftest.py and setup.cfg); with_downloads tests run here on offline stand-ins
    for marker in (
        "unit: NeMo's unit tests",
        "integration: NeMo's integration tests",
        "with_downloads: NeMo test that downloads a model (here: uses a synthetic stand-in)",
        "pleasefixme: NeMo test that NeMo's CI does not run",
        "run_only_on(device): NeMo test for one device only [CPU | GPU]",
        "nightly: NeMo nightly QA test",
    ):
        config.addinivalue_line("markers", marker)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not _is_vendored(item):
            continue
        if item.get_closest_marker("pleasefixme"):
            item.add_marker(pytest.mark.skip(reason=PLEASEFIXME))
            continue
        expected = _first_match(EXPECTED, _key(item))
        if expected is not None:
            outcome, reason = expected
            mark = pytest.mark.skip(reason=reason) if outcome == SKIP else pytest.mark.xfail(strict=True, reason=reason)
            item.add_marker(mark)


# --- running: offline models, one thread, a time limit ---

_STAND_INS: stand_ins.ModelStandIns | None = None


def _stand_ins() -> stand_ins.ModelStandIns:
    global _STAND_INS
    if _STAND_INS is None:
        _STAND_INS = stand_ins.ModelStandIns()
    return _STAND_INS


@contextlib.contextmanager
def _time_limit(seconds: int, what: str) -> Iterator[None]:
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"{what} ran longer than {seconds} s (tests/nemo_upstream/conftest.py TIME_LIMIT_S)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _is_vendored(item):
        return (yield)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: per-op overhead dominates, more threads on a busy CPU just spin
    try:
        upstream_substitution.comparison_off_reason = _first_match(NEMO_IS_WRONG, _key(item))
        with stand_ins.offline_pretrained(_stand_ins(), _variant(item)), _time_limit(TIME_LIMIT_S, item.nodeid):
            return (yield)
    finally:
        upstream_substitution.comparison_off_reason = None
        torch.set_num_threads(threads)


# --- NeMo's fixtures, offline ---


@pytest.fixture(scope="session")
def test_data_dir(tmp_path_factory) -> str:
    """NeMo's test data directory, with synthetic audio in place of an4 (upstream_stand_ins.write_test_data)."""
    return str(stand_ins.write_test_data(tmp_path_factory.mktemp("nemo_test_data")))


@pytest.fixture(scope="session")
def an4_val_manifest_corrected(test_data_dir) -> Path:
    return Path(test_data_dir) / "asr" / "an4_val.json"


@pytest.fixture(scope="session")
def an4_train_manifest_corrected(test_data_dir) -> Path:
    return Path(test_data_dir) / "asr" / "an4_train.json"


@pytest.fixture
def device() -> str:
    """NeMo's ``device`` fixture (its tests/conftest.py)."""
    return "GPU" if torch.cuda.is_available() else "CPU"


def _shared_model(request, name: str):
    """NeMo's package-scoped model fixtures: one model per variant, its decoding config restored after each test."""
    model = _stand_ins().shared(name, _variant(request.node))
    with preserve_decoding_cfg_and_cpu_device(model):
        yield model


@pytest.fixture
def stt_en_conformer_transducer_small(request):
    yield from _shared_model(request, "stt_en_conformer_transducer_small")


@pytest.fixture
def stt_en_fastconformer_transducer_large(request):
    yield from _shared_model(request, "stt_en_fastconformer_transducer_large")


@pytest.fixture
def stt_en_fastconformer_tdt_large(request):
    yield from _shared_model(request, "nvidia/stt_en_fastconformer_tdt_large")


@pytest.fixture
def canary_180m_flash(request):
    yield from _shared_model(request, "nvidia/canary-180m-flash")
