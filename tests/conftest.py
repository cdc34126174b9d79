"""Fixtures shared across test directories.

`netns` (tests/netns.py): network namespaces on a bridge, for tests that cross hosts.
Loaded here, before any test module imports it, so pytest rewrites its asserts.
"""

pytest_plugins = ["netns"]
