"""The build backend of `pip install .`: maturin's, and the native module into its wheel.

maturin builds the `packfs` binary; the same compile of the engine gives the library's cdylib,
the module `packfs._native`, which `wheel_module.add_module` adds to the wheel. Every other hook
(metadata, sdist) is maturin's own.
"""

import json
import os
import subprocess
import sys
import time

import maturin
from maturin import *  # noqa: F401,F403  (the hooks this module does not change)

from wheel_module import add_module


def _library() -> str:
    """The cdylib of the release build maturin just ran (its target directory, host target)."""
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        check=True, capture_output=True, text=True,
    )
    target = json.loads(meta.stdout)["target_directory"]
    return os.path.join(target, "release", "deps", "libpackfs.so")


def _tell(line):
    """A line for the person waiting: pip hides a backend's output unless run with -v, and a
    release build of packfs takes 5-20 minutes, so it also goes to the terminal when there is
    one (pip shows only "still running..." otherwise)."""
    print(f"packfs: {line}", file=sys.stderr, flush=True)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"packfs: {line}\n")
    except OSError:
        pass  # no terminal: a batch job's log has the stderr line


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    started = time.monotonic()
    _tell(
        "compiling the packfs binary and its Python module (Rust, release): 5-20 minutes on "
        f"{os.cpu_count()} core(s); `pip install -v .` shows cargo's progress"
    )
    name = maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    wheel = add_module(os.path.join(wheel_directory, name), _library())
    _tell(f"built {os.path.basename(wheel)} in {(time.monotonic() - started) / 60:.1f} min")
    return os.path.basename(wheel)
