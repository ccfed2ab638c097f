"""`python -m runner.cli ...`: the same commands as the `runner` console script."""

from runner.cli.main import main

main()
