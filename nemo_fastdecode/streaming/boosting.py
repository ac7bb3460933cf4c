"""Per-slot phrase boosting: every stream's own boosting tree, all of them in one structure, one id per slot.

NeMo's per-stream biasing (its streaming pipelines with ``greedy.enable_per_stream_biasing``) keeps every stream's
boosting tree (``GPUBoostingTreeModel``, built from the stream's ``BiasingRequestItemConfig``) in one
``GPUBiasingMultiModel``: the trees' arcs and states side by side, each tree with its weight, and each row of a batch
names its tree by id (``-1``: none). :class:`SlotBoosting` holds that multi-model for the engine's slots: a tree is
added when a stream with :class:`~nemo_fastdecode.streaming.events.BoostingOptions` opens and removed when it ends;
``model_ids [S + 1]`` on the device says which tree each slot fuses, gathered by slot ids with the decoder's state, and
``weights [S + 1]`` (float64) its weight as given (the beam search sums the fusion weights in double, as NeMo does).
The multi-model is NeMo's own; one advance scores every row of a batch against its own tree (a Triton kernel on
CUDA, capturable in a CUDA graph).

Trees are built on the host (tokenising the phrases, NeMo's ``ContextGraph``); equal options reuse a built tree.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_fastdecode.streaming.events import BoostingOptions

if TYPE_CHECKING:
    from nemo.collections.asr.parts.context_biasing import GPUBoostingTreeModel

__all__ = ["NEMO_UNSUPPORTED_OPTIONS", "TREE_OPTIONS", "SlotBoosting", "boosting_options_from_nemo"]

TREE_CACHE_SIZE = 64  # built trees kept for reuse (streams of one client usually share their phrases)

# NeMo's BoostingTreeModelConfig options BoostingOptions takes (by the same name), and the NeMo name of its weight
TREE_OPTIONS = (
    "context_score",
    "depth_scaling",
    "unk_score",
    "final_eos_score",
    "score_per_phrase",
    "uniform_weights",
)
# NeMo's options not taken, with why; only their NeMo defaults are accepted
NEMO_UNSUPPORTED_OPTIONS = {
    "model_path": (None, "a prebuilt tree file; give the phrases"),
    "key_phrases_file": (None, "a phrases file; give the phrases as a list"),
    "key_phrase_items_list": (None, "per-phrase languages (aggregate tokenizers); give the phrases as a list"),
    "source_lang": ("en", "phrase languages of aggregate tokenizers"),
    "use_bpe_dropout": (False, "alternative tokenisations by BPE dropout"),
    "cache_key": (None, "NeMo's tree cache (equal options share a built tree here)"),
    "multi_model_id": (None, "trees added to the multi-model by hand (the engine adds and removes them)"),
    "auto_manage_multi_model": (True, "trees added to the multi-model by hand (the engine adds and removes them)"),
}
# NeMo's options that do not change the tree or the decoding here: accepted, not used
_IGNORED = ("use_triton", "num_of_transcriptions", "bpe_alpha")


def boosting_options_from_nemo(config: Any) -> BoostingOptions:
    """:class:`BoostingOptions` from NeMo's ``BiasingRequestItemConfig`` or ``BoostingTreeModelConfig`` (dataclasses,
    ``DictConfig`` or dicts with NeMo's keys).

    Raises:
        ValueError: an option NeMo has and the engine does not take (naming it), or no ``key_phrases_list``.
    """
    fields = _as_dict(config)
    weight = 1.0
    if "boosting_model_cfg" in fields or "boosting_model_alpha" in fields:  # a BiasingRequestItemConfig
        weight = fields.pop("boosting_model_alpha", 1.0)
        outer = {name: fields.pop(name) for name in list(fields) if name != "boosting_model_cfg"}
        fields = {**outer, **_as_dict(fields.get("boosting_model_cfg") or {})}
    for name, (default, what) in NEMO_UNSUPPORTED_OPTIONS.items():
        if name in fields and fields[name] != default:
            raise ValueError(
                f"NeMo's boosting option {name}={fields[name]!r} ({what}) is not supported by the streaming engine; "
                f"leave it at {default!r}"
            )
    known = {"key_phrases_list", *TREE_OPTIONS, *NEMO_UNSUPPORTED_OPTIONS, *_IGNORED}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown boosting option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    phrases = fields.get("key_phrases_list")
    if not phrases:
        raise ValueError("the boosting config has no key_phrases_list: give the phrases to boost")
    tree = {name: fields[name] for name in TREE_OPTIONS if name in fields}
    return BoostingOptions(phrases=tuple(phrases), weight=weight, **tree)


def _as_dict(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return dict(config)
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        return dict(OmegaConf.to_container(config, resolve=True))
    raise TypeError(
        f"a boosting config must be a NeMo config dataclass, DictConfig or dict, got {type(config).__name__}"
    )


class SlotBoosting:
    """The boosting trees of ``num_slots`` slots in NeMo's ``GPUBiasingMultiModel``.

    Args:
        model: the NeMo ASR model (its ``tokenizer`` tokenises the phrases, as NeMo's pipelines do).
        num_slots: ``S``; row ``S`` (the dummy slot) never has a tree.
        vocab_size: the decoder's labels without blank.
        device: where the trees and the slots' ids live.
        on_reallocate: called when the multi-model's storage grows (graphs captured on it must be dropped).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_slots: int,
        vocab_size: int,
        device: torch.device,
        on_reallocate: Callable[[], None] | None = None,
    ):
        from nemo.collections.asr.parts.context_biasing.biasing_multi_model import GPUBiasingMultiModel

        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"phrase boosting needs a model with a tokenizer; {type(model).__name__} has none")
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} tokens, the decoder {vocab_size} labels (without blank)"
            )
        self.tokenizer, self.vocab_size, self.device = tokenizer, vocab_size, device
        with torch.inference_mode(False):  # NeMo edits the multi-model's tensors in place as trees come and go
            self.multi_model = GPUBiasingMultiModel(vocab_size=vocab_size, reallocation_callback_fn=on_reallocate)
            self.multi_model.to(device)
            self.model_ids = torch.full([num_slots + 1], -1, dtype=torch.long, device=device)  # [S + 1]
            self.weights = torch.zeros([num_slots + 1], dtype=torch.float64, device=device)  # [S + 1], 0: no tree
        self._ids = np.full(num_slots + 1, -1, dtype=np.int64)  # host mirror
        self._trees: OrderedDict[BoostingOptions, GPUBoostingTreeModel] = OrderedDict()

    def boosted(self, slots: np.ndarray) -> bool:
        """Whether any of ``slots`` has a tree (host only)."""
        return bool(self.has_tree(slots).any())

    def has_tree(self, slots: np.ndarray) -> np.ndarray:
        """``[N]`` bool: whether each of ``slots`` has a tree (host only)."""
        return self._ids[slots] >= 0

    def tree(self, options: BoostingOptions) -> GPUBoostingTreeModel:
        """NeMo's boosting tree of ``options`` (``GPUBoostingTreeModel.from_config`` with the model's tokenizer)."""
        tree = self._trees.get(options)
        if tree is not None:
            self._trees.move_to_end(options)
            return tree
        from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig, GPUBoostingTreeModel

        for i, phrase in enumerate(options.phrases):
            if not self.tokenizer.text_to_ids(phrase):
                raise ValueError(f"boosting phrase {i} ({phrase!r}) has no tokens in this model's vocabulary")
        config = BoostingTreeModelConfig(
            key_phrases_list=list(options.phrases), **{name: getattr(options, name) for name in TREE_OPTIONS}
        )
        with torch.inference_mode(False):
            tree = GPUBoostingTreeModel.from_config(config, tokenizer=self.tokenizer)
        self._trees[options] = tree
        if len(self._trees) > TREE_CACHE_SIZE:
            self._trees.popitem(last=False)
        return tree

    def attach(self, slot: int, options: BoostingOptions) -> None:
        """Give ``slot`` the tree of ``options`` (built, or reused) with its weight."""
        self.detach(slot)
        tree = self.tree(options)
        with torch.inference_mode(False), torch.no_grad():
            model_id = self.multi_model.add_model(tree, alpha=float(options.weight))
            self.model_ids[slot] = model_id
            self.weights[slot] = float(options.weight)
        self._ids[slot] = model_id

    def detach(self, slot: int) -> None:
        """The slot's tree (if any) leaves the multi-model."""
        model_id = int(self._ids[slot])
        if model_id < 0:
            return
        with torch.inference_mode(False), torch.no_grad():
            self.multi_model.remove_model(model_id)
            self.model_ids[slot] = -1
            self.weights[slot] = 0.0
        self._ids[slot] = -1
