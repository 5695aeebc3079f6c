"""Helpers of the integration tests, re-exported by conftest.py (whose docstring maps them)."""
