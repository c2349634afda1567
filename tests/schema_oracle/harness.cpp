// The JSON-schema oracle: llama.cpp's own `json_schema_to_grammar`, built from the reference tree's `common/`
// sources by build.py, run by the schema tests as a subprocess so a crash of llama.cpp cannot take pytest down.
//
//   harness convert < schema.json   the grammar on stdout, exit 0; llama.cpp's warnings stay on stderr
//                                   refusal (std::invalid_argument): its message on stdout, exit 2
//                                   text that is not JSON (common_json_error): the message on stdout, exit 3
//                                   any other exception: "<what>" on stdout, exit 4
//   harness dump < value.json       the value as nlohmann's dump() prints it, exit 0 (3 when not JSON)
//
// The schema is read as bytes, exactly as a caller of llama.cpp would hand it over: common_json::parse, then
// json_schema_to_grammar(schema, /* force_gbnf */ true), the call llama.cpp's own test makes.
#include "json-schema-to-grammar.h"
#include "json.h"

#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>

static std::string read_stdin() {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    return text;
}

static int answer(const std::string & text, int code) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return code;
}

int main(int argc, char ** argv) {
    std::ios::sync_with_stdio(false);
    const std::string mode = argc > 1 ? argv[1] : "convert";
    const std::string text = read_stdin();

    common_json value;
    try {
        value = common_json::parse(text);
    } catch (const common_json_error & e) {
        return answer(e.what(), 3);
    }

    if (mode == "dump") {
        return answer(value.dump(), 0);
    }
    if (mode != "convert") {
        return answer("unknown mode " + mode, 64);
    }
    try {
        return answer(json_schema_to_grammar(value, /* force_gbnf= */ true), 0);
    } catch (const std::invalid_argument & e) {
        return answer(e.what(), 2);
    } catch (const std::exception & e) {
        return answer(e.what(), 4);
    }
}
