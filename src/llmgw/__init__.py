"""llmgw: one OpenAI-compatible endpoint in front of a self-hosted GPU fleet."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmgw")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
