"""The `runner` command line: one module per command; the launch flags and one-line errors they share in support.py.

The console script is `runner.cli.main:main`; `python -m runner.cli` runs the same.
"""
