"""``python -m graphdist ARGS``: the ``graphdist`` command line, the same as the ``graphdist`` script.

Useful where the ``graphdist`` script is not on ``PATH`` (a virtual environment that is not
activated), since it runs with the interpreter that was named.
"""

import sys

from graphdist.cli.main import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
