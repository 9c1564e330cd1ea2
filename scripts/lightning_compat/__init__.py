"""The parts of scripts/lightning_suite.py: rewriting Lightning's tests, the private-internals rule, the tally.

Each module is pure (text in, data out) except ``runner``, which builds the temporary trees and runs pytest;
``sandbox/`` holds the files the runner drops into the gpulayer side's temporary tree (our conftest, RunIf,
the outcome collector, the import guard).
"""
