"""Every NeMo touch point is a named patch (:data:`nemo_fastdecode.nemo.PATCHES`): installed by the import,
really in place, idempotent; and the start-up hook reads the same constants as the package."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

import nemo_fastdecode
from nemo_fastdecode.nemo import PATCHES, constants, install, registry
from nemo_fastdecode.nemo import logs as nemo_logs
from nemo_fastdecode.nemo.patches import is_ours

AUTOLOAD = Path(__file__).parents[1] / "autoload" / "nemo_fastdecode_autoload.py"


def load_autoload(name: str = "autoload_under_test"):
    """The start-up hook as the wheel ships it (not the copy in site-packages), freshly executed and not installed
    (``NEMO_FASTDECODE_AUTOLOAD=0``: a second hook would wrap NeMo's patched functions again)."""
    spec = importlib.util.spec_from_file_location(name, AUTOLOAD)
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NEMO_FASTDECODE_AUTOLOAD", "0")
        spec.loader.exec_module(module)
    assert not module.installed()
    return module


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.install_function)
def test_each_patch_is_in_place_and_a_second_install_changes_nothing(patch):
    targets = patch.targets()
    assert targets, f"{patch.name}: nothing patched"
    assert all(is_ours(obj) for obj in targets.values()), {k: v for k, v in targets.items() if not is_ours(v)}
    for obj in targets.values():  # a replaced function keeps NeMo's own
        wrapped = getattr(obj, "__wrapped__", None)
        assert wrapped is None or not is_ours(wrapped)
    patch.install()
    install()
    nemo_fastdecode.register()
    again = patch.targets()
    assert again.keys() == targets.keys()
    assert all(again[label] is obj for label, obj in targets.items())


def test_the_patches_are_named_once_and_documented():
    assert len({p.name for p in PATCHES}) == len(PATCHES)
    assert len({(p.module, p.install_function) for p in PATCHES}) == len(PATCHES)
    for patch in PATCHES:
        assert f".{patch.module}.{patch.install_function}" in nemo_fastdecode.nemo.__doc__
        module = importlib.import_module(f"nemo_fastdecode.nemo.{patch.module}")
        assert module.__doc__ and getattr(module, patch.install_function).__doc__


def test_the_nemo_logger_filter_is_attached_once():
    nemo_logs.quiet_repeated_nemo_lines()
    assert logging.getLogger("nemo_logger").filters.count(nemo_logs.NEMO_FILTER) == 1


def test_the_strategy_names_are_the_rows_of_the_strategy_table():
    assert tuple(registry.FAST_STRATEGIES) == constants.STRATEGIES
    assert set(constants.STRATEGIES) <= set(registry.valid_strategies())


def test_the_start_up_hook_reads_every_constant_of_the_package_lazily():
    autoload = load_autoload()
    assert autoload._constants is None  # nothing read at start-up
    ours = {name: value for name, value in vars(constants).items() if name.isupper()}
    assert set(ours) == {"STRATEGIES", "PORTABLE_KEY", "FAST_PIPELINE_TYPE"}
    assert autoload.constants() == ours
    # read from the file, as at interpreter start (the package not imported): the same values
    autoload._constants = None
    autoload._CONSTANTS_MODULE = "nemo_fastdecode.nemo.not_imported"
    assert autoload.constants() == ours
    assert autoload._wants_fastdecode({"strategy": "fast_beam"})
    assert autoload._wants_fastdecode({"strategy": "greedy_batch", constants.PORTABLE_KEY: {"strategy": "fast_greedy"}})
    assert not autoload._wants_fastdecode({"strategy": "greedy_batch"})
    assert autoload._wants_fast_pipeline({"pipeline_type": constants.FAST_PIPELINE_TYPE.upper()})
    assert not autoload._wants_fast_pipeline({"pipeline_type": "cache_aware"})


def test_the_start_up_hook_without_the_package_leaves_nemo_alone(monkeypatch):
    autoload = load_autoload()
    autoload._CONSTANTS_MODULE = "nemo_fastdecode.nemo.not_imported"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # a stale .pth: the package is gone
    assert autoload.constants() == {}
    assert not autoload._wants_fastdecode({"strategy": "fast_greedy"})
    assert not autoload._wants_fast_pipeline({"pipeline_type": "fast_cache_aware"})
