"""Patch: ``.nemo`` files saved with one of our strategies load where this package is not installed.

NeMo's ``FileIO.to_config_file`` (which ``ModelPT.save_to`` calls, for every NeMo model type) writes the model's
config into the ``.nemo`` archive. :func:`install_portable_save` wraps it: when the model decodes with one of our
strategies, the archive gets :func:`~nemo_fastdecode.nemo.registry.portable_decoding_config` (NeMo's stand-in
strategy, ours under :data:`~nemo_fastdecode.nemo.constants.PORTABLE_KEY`), so that it loads with the stand-in
without this package and with ours with it (the decoding hook of :mod:`.registry` reads the key back). The
model's own config is unchanged. Idempotent: the wrapper is marked; NeMo's method is its ``__wrapped__``.
"""

from __future__ import annotations

import functools

from nemo_fastdecode.nemo.patches import is_ours, mark
from nemo_fastdecode.nemo.registry import portable_decoding_config

__all__ = ["install_portable_save", "portable_targets"]


def install_portable_save() -> None:
    """``FileIO.to_config_file`` writes the portable decoding config (idempotent)."""
    from nemo.core.classes.common import FileIO

    nemo_to_config_file = FileIO.to_config_file
    if is_ours(nemo_to_config_file):
        return

    @functools.wraps(nemo_to_config_file)
    def to_config_file(self, path2yaml_file: str):
        portable = portable_decoding_config(getattr(self, "_cfg", None))
        if portable is None:
            return nemo_to_config_file(self, path2yaml_file)
        own = self._cfg
        self._cfg = portable
        try:
            return nemo_to_config_file(self, path2yaml_file)
        finally:
            self._cfg = own

    FileIO.to_config_file = mark(to_config_file, nemo_to_config_file)


def portable_targets() -> dict[str, object]:
    from nemo.core.classes.common import FileIO

    return {"FileIO.to_config_file": FileIO.to_config_file}
