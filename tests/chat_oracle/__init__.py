"""llama.cpp's chat layer, built from the pinned sources, as an oracle for the tests."""
