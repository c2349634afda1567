"""llama.cpp's JSON-schema converter as a test oracle: a small C++ harness built from the reference tree."""
