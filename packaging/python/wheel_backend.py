"""The build backend of `pip install .`: maturin's, and the native module into its wheel.

maturin builds the `packfs` binary; the same compile of the engine gives the library's cdylib,
the module `packfs._native`, which `wheel_module.add_module` adds to the wheel. Every other hook
(metadata, sdist) is maturin's own.
"""

import json
import os
import subprocess

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


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    wheel = add_module(os.path.join(wheel_directory, name), _library())
    return os.path.basename(wheel)
