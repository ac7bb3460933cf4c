"""The mechanical substitution: NeMo's test files, re-compiled with our strategies in place of NeMo's.

A vendored test file is parsed and its syntax tree rewritten, node by node, before it is compiled (line numbers
are kept, so tracebacks point at NeMo's lines); nothing else in the file changes and every assertion stays:

* string literals ``"greedy_batch"`` -> ``"fast_greedy"`` and ``"malsd_batch"`` -> ``"fast_beam"``
  (:data:`STRING_SUBSTITUTIONS`; whole literals only, e.g. ``decoding_cfg.strategy = "greedy_batch"`` and the
  ``search_type`` values of parametrised beam configs);
* every read of NeMo's batched infer classes and of ``RNNTDecodingConfig`` (as a bare name or an attribute,
  ``greedy_decode.GreedyBatchedTDTInfer``) -> the substitute of the same name in :data:`SUBSTITUTES`:

  - ``GreedyBatchedRNNTInfer`` / ``GreedyBatchedTDTInfer`` -> ``FastGreedyBatchedInfer``, called with exactly the
    arguments the test passed, matched to NeMo's parameter names;
  - ``BeamBatchedRNNTInfer`` / ``BeamBatchedTDTInfer`` with ``search_type`` ``"fast_beam"`` (NeMo's
    ``"malsd_batch"``, also its default) -> ``FastBeamBatchedInfer`` with the other arguments; any other
    ``search_type`` (``maes_batch``) is not one of ours and stays NeMo's class;
  - ``RNNTDecodingConfig()`` -> NeMo's dataclass with ``strategy="fast_greedy"`` unless the test passes one
    (NeMo's default is ``greedy_batch``).

  Each substituted infer object is wrapped in :class:`ComparedWithNeMo`, which also runs NeMo's own class,
  built from the same arguments, on every decoding call and asserts that both return the same hypotheses
  (tokens, timestamps, TDT durations, scores): the like-for-like comparison that replaces the expectations
  NeMo's tests take from real speech. Attribute access goes to our object, so anything NeMo's class has and
  ours lacks fails as it would for a user.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
from nemo.collections.asr.parts.submodules import rnnt_beam_decoding, rnnt_greedy_decoding, tdt_beam_decoding
from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTDecodingConfig
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis, NBestHypotheses

from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

STRING_SUBSTITUTIONS = {"greedy_batch": "fast_greedy", "malsd_batch": "fast_beam"}
#: relative score tolerance, as the project's own exactness tests
SCORE_RTOL = 1e-5
#: the global through which substituted modules reach the substitutes
SUBSTITUTES_NAME = "__nemo_upstream_substitutes__"
#: name of the variant attribute set on every substituted module
VARIANT_ATTRIBUTE = "__nemo_upstream_variant__"


#: why the comparison with NeMo is off for the running test (set by conftest.py from its NEMO_IS_WRONG table)
comparison_off_reason: str | None = None


class ComparedWithNeMo:
    """Our infer object, checked against NeMo's on every call that starts new utterances.

    Calls with ``partial_hypotheses`` (streaming continuations) are not compared: each strategy can only continue
    from its own decoder state.
    """

    def __init__(self, ours, nemo, description: str):
        self._ours, self._nemo, self._description = ours, nemo, description

    def __call__(self, *args, **kwargs):
        result = self._ours(*args, **kwargs)
        if comparison_off_reason is None and kwargs.get("partial_hypotheses") is None and len(args) < 3:
            expected = self._nemo(*args, **kwargs)
            assert_same_hypotheses(result[0], expected[0], self._description)
        return result

    def __getattr__(self, name: str):
        return getattr(self._ours, name)


def _as_list(values) -> list:
    if values is None:
        return []
    return torch.as_tensor(values).reshape(-1).tolist() if not isinstance(values, list) else list(values)


def assert_same_hypotheses(ours: list, nemo: list, description: str) -> None:
    """Same number of hypotheses, and per hypothesis the same tokens, timestamps, TDT durations and score."""
    assert len(ours) == len(nemo), f"{description}: {len(ours)} hypotheses, NeMo returns {len(nemo)}"
    for i, (a, b) in enumerate(zip(ours, nemo, strict=True)):
        where = f"{description}, utterance {i}"
        if isinstance(b, NBestHypotheses):
            assert isinstance(a, NBestHypotheses), f"{where}: {type(a).__name__}, NeMo returns NBestHypotheses"
            assert_same_hypotheses(a.n_best_hypotheses, b.n_best_hypotheses, f"{where} (n-best)")
            continue
        assert isinstance(a, Hypothesis), f"{where}: {type(a).__name__}, NeMo returns a Hypothesis"
        assert _as_list(a.y_sequence) == _as_list(b.y_sequence), f"{where}: tokens differ from NeMo's"
        assert _as_list(a.timestamp) == _as_list(b.timestamp), f"{where}: timestamps differ from NeMo's"
        if len(_as_list(b.token_duration)):
            assert _as_list(a.token_duration) == _as_list(b.token_duration), f"{where}: durations differ"
        # scores to float32 rounding: NeMo's CPU frame loop log-softmaxes twice (README.md, Exactness)
        assert math.isclose(float(a.score), float(b.score), rel_tol=SCORE_RTOL, abs_tol=SCORE_RTOL), (
            f"{where}: score {float(a.score)!r}, NeMo's {float(b.score)!r}"
        )


def _passed_arguments(nemo_class: type, args: tuple, kwargs: dict) -> dict:
    """The arguments the test passed, by NeMo's parameter names (defaults left out)."""
    bound = inspect.signature(nemo_class.__init__).bind(None, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self")
    return arguments


def _greedy_substitute(nemo_class: type) -> Callable:
    def build(*args, **kwargs):
        arguments = _passed_arguments(nemo_class, args, kwargs)
        ours = FastGreedyBatchedInfer(**arguments)
        return ComparedWithNeMo(ours, nemo_class(*args, **kwargs), f"fast_greedy vs NeMo's {nemo_class.__name__}")

    build.__name__ = build.__qualname__ = nemo_class.__name__
    return build


def _beam_substitute(nemo_class: type) -> Callable:
    ours_search = STRING_SUBSTITUTIONS["malsd_batch"]

    def build(*args, **kwargs):
        arguments = _passed_arguments(nemo_class, args, kwargs)
        search_type = arguments.pop("search_type", ours_search)  # NeMo's default is malsd_batch
        if search_type != ours_search:  # maes_batch: not one of ours
            return nemo_class(*args, **kwargs)
        ours = FastBeamBatchedInfer(**arguments)
        nemo = nemo_class(**arguments, search_type="malsd_batch")
        return ComparedWithNeMo(ours, nemo, f"fast_beam vs NeMo's {nemo_class.__name__}(search_type='malsd_batch')")

    build.__name__ = build.__qualname__ = nemo_class.__name__
    return build


def _decoding_config_substitute(*args, **kwargs) -> RNNTDecodingConfig:
    kwargs.setdefault("strategy", STRING_SUBSTITUTIONS["greedy_batch"])
    return RNNTDecodingConfig(*args, **kwargs)


SUBSTITUTES = types.SimpleNamespace(
    GreedyBatchedRNNTInfer=_greedy_substitute(rnnt_greedy_decoding.GreedyBatchedRNNTInfer),
    GreedyBatchedTDTInfer=_greedy_substitute(rnnt_greedy_decoding.GreedyBatchedTDTInfer),
    BeamBatchedRNNTInfer=_beam_substitute(rnnt_beam_decoding.BeamBatchedRNNTInfer),
    BeamBatchedTDTInfer=_beam_substitute(tdt_beam_decoding.BeamBatchedTDTInfer),
    RNNTDecodingConfig=_decoding_config_substitute,
)


#: the names whose reads are substituted (the attributes of SUBSTITUTES)
SUBSTITUTED_NAMES = frozenset(vars(SUBSTITUTES))


class _Substitution(ast.NodeTransformer):
    """Rewrites the string literals and the reads of substituted names (see the module docstring)."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and node.value in STRING_SUBSTITUTIONS:
            return ast.copy_location(ast.Constant(STRING_SUBSTITUTIONS[node.value]), node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in SUBSTITUTED_NAMES:
            return self._substitute(node.id, node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load) and node.attr in SUBSTITUTED_NAMES:
            return self._substitute(node.attr, node)
        return node

    @staticmethod
    def _substitute(name: str, node: ast.AST) -> ast.AST:
        substitute = ast.Attribute(value=ast.Name(SUBSTITUTES_NAME, ast.Load()), attr=name, ctx=ast.Load())
        return ast.copy_location(substitute, node)


def substituted_source_tree(path: Path) -> ast.Module:
    """The syntax tree of NeMo's file at ``path`` with the substitutions applied."""
    source = path.read_bytes()
    tree = _Substitution().visit(ast.parse(source, filename=str(path)))
    return ast.fix_missing_locations(tree)


def load_substituted_module(path: Path, variant: str, config=None) -> types.ModuleType:
    """Compile and execute the substituted copy of the test file at ``path`` as a module of its own."""
    tree = substituted_source_tree(path)
    try:  # pytest's assertion rewriting (detailed failure messages), as for the untouched file
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, path.read_bytes(), str(path), config)
    except ImportError:  # plain asserts still assert
        pass
    name = f"nemo_upstream_{variant}.{path.stem}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    setattr(module, SUBSTITUTES_NAME, SUBSTITUTES)
    setattr(module, VARIANT_ATTRIBUTE, variant)
    sys.modules[name] = module
    try:
        exec(compile(tree, str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
