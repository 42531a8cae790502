"""`llmgw`'s one entry point: what it does when its output goes nowhere."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cluster import environment

# A stand-in command that prints far more than a pipe holds, the way
# `ctl logs -n 2000` or `ctl replicas --json` on a large fleet does.
NOISY = """
import argparse, sys
from llmgw import cli

def noisy(args):
    for _ in range(200_000):
        print("x" * 99)

def parser():
    p = argparse.ArgumentParser()
    p.set_defaults(func=noisy)
    return p

cli.build_parser = parser
sys.exit(cli.main([]))
"""


def test_a_reader_that_stops_early_gets_no_traceback():
    proc = subprocess.Popen([sys.executable, "-c", NOISY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=environment())
    assert proc.stdout.read(100) == b"x" * 99 + b"\n"
    proc.stdout.close()  # `| head -1` exits here
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()
    assert b"BrokenPipeError" not in err
    assert proc.returncode == 0
