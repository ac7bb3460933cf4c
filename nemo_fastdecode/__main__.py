"""``python -m nemo_fastdecode COMMAND [key=value ...]``: the same as the ``nemo-fastdecode`` console script."""

import sys

from nemo_fastdecode.apps.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
