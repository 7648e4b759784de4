"""``python -m cifar10_dist``: the same as the ``cifar10-dist`` console script."""

from cifar10_dist.cli import run_and_exit

if __name__ == "__main__":
    run_and_exit()
