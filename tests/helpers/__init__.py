"""Helpers the tests share (the fixtures are in tests/conftest.py)."""
