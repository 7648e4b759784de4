"""The command line: ``cifar10-dist run | lr-find | batch-size | evaluate | predict | export | tune | prepare-data |
report | doctor | config``, a thin fire layer over the API (``cifar10_dist.api``, the floor below; it imports
nothing above it).

User errors (bad flags, missing data, unusable checkpoints) end as one line on stderr and exit code 2,
a diverged run (NaN loss) with 3, a preempted run (SIGTERM/SIGUSR1, checkpoint written) with 75;
``--debug`` shows the traceback instead.

Its modules: ``entry`` (``main``: help, errors and exit codes around the command), ``subcommands`` (one function
a command: flags to the API call), ``printing`` (what each command prints), ``flags`` (every command's own flags,
a mistyped flag's suggestion, switches before paths, a closed pipe), ``help_pages`` (the help pages).
"""

from cifar10_dist.cli.entry import COMMANDS, main, run_and_exit

__all__ = ["COMMANDS", "main", "run_and_exit"]
