// Runs llama.cpp's trigger-pattern search (llama_grammar_trigger_pattern::find, taken from the reference
// source at build time into trigger-find.inc) on patterns and texts read from stdin.
//
// Input, repeated until the end: u32 pattern length, the pattern, u32 text count, then each text as u32
// length and bytes (lengths little-endian). Output, a line per text: the start llama.cpp replays from, -1
// for none, or "error <code>" when std::regex throws while matching; a pattern std::regex refuses answers
// one line "refused <code>" in place of its texts.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "trigger-pattern.inc"
#include "trigger-find.inc"

static bool read_u32(uint32_t & value) {
    unsigned char bytes[4];
    if (std::fread(bytes, 1, 4, stdin) != 4) {
        return false;
    }
    value = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
    return true;
}

static std::string read_bytes(uint32_t length) {
    std::string text(length, '\0');
    if (length > 0 && std::fread(&text[0], 1, length, stdin) != length) {
        std::exit(3);
    }
    return text;
}

int main() {
    uint32_t length = 0;
    while (read_u32(length)) {
        llama_grammar_trigger_pattern trigger;
        trigger.pattern = read_bytes(length);
        uint32_t count = 0;
        if (!read_u32(count)) {
            return 3;
        }
        std::vector<std::string> texts;
        for (uint32_t i = 0; i < count; i++) {
            if (!read_u32(length)) {
                return 3;
            }
            texts.push_back(read_bytes(length));
        }
        try {
            trigger.regex = std::regex(trigger.pattern);  // as llama_grammar_init_impl builds it
        } catch (const std::regex_error & error) {
            std::printf("refused %d\n", static_cast<int>(error.code()));
            continue;
        }
        for (const auto & text : texts) {
            try {
                size_t start = trigger.find(text);
                std::printf("%lld\n", start == std::string::npos ? -1LL : static_cast<long long>(start));
            } catch (const std::regex_error & error) {
                std::printf("error %d\n", static_cast<int>(error.code()));
            }
        }
    }
    return 0;
}
