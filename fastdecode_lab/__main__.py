"""``python -m fastdecode_lab COMMAND [key=value ...]``: the ``nemo-fastdecode`` console script with the lab's model
names too (``nemo-fastdecode serve model=tiny-streaming``: a synthetic preset)."""

import sys

import fastdecode_lab.models  # noqa: F401  (registers the synthetic presets with the apps' loader)
from nemo_fastdecode.apps.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
