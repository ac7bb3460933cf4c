"""``python -m nemo_fastdecode.serve [key=value ...]``: the same as ``nemo-fastdecode serve``.

An entry point, not library code: it runs the tools' CLI, which loads the model (the shipped trained model by default).
"""

import sys

from nemo_fastdecode.tools.serve_cli import main

raise SystemExit(main(sys.argv[1:]))
