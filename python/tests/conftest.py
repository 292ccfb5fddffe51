"""CI runs the same hypothesis examples every time (derandomized, no example database), so a
red run can be rerun as it was; elsewhere examples are fresh on each run."""

import os

try:
    from hypothesis import settings
except ImportError:  # the sampler tests skip without hypothesis (and torch)
    settings = None

if settings is not None:
    settings.register_profile("ci", derandomize=True, database=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")
