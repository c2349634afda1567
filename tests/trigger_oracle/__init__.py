"""llama.cpp's trigger-pattern search as a test oracle: std::regex, as its grammar runs it."""
