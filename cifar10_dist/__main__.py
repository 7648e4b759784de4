"""``python -m cifar10_dist``: the same as the ``cifar10-dist`` console script."""

import sys

from cifar10_dist.cli import main

if __name__ == "__main__":
    sys.exit(main())
