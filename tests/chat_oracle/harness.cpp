// The chat oracle: llama.cpp's chat layer (common/chat.cpp and what it builds on), driven by one JSON
// request on stdin, answering one JSON object on stdout. Linked against the pinned sources' llama-common
// (tests/chat_oracle/build.py).
//
// Request (every field but "template" optional; names as llama-server's OpenAI API has them):
//   {"mode": "apply" | "parse" | "analyze", "template": "<jinja source>", "bos_token": "", "eos_token": "",
//    "messages": [OpenAI messages], "tools": [OpenAI tools], "tool_choice": "auto" | "required" | "none",
//    "parallel_tool_calls": false, "json_schema": {...}, "grammar": "",
//    "reasoning_format": "none" | "auto" | "deepseek" | "deepseek-legacy", "enable_thinking": true,
//    "add_generation_prompt": true, "continue_final_message": true | "reasoning_content" | "content",
//    "chat_template_kwargs": {"name": <json>}, "now": <unix seconds>,
//    parse mode only: "text": "...", "is_partial": false, "parse_tool_calls": true,
//    "reasoning_in_content": false}
// "apply" answers common_chat_templates_init(nullptr, template, bos, eos) + common_chat_templates_apply:
//   {"format", "prompt", "grammar", "grammar_lazy", "generation_prompt", "supports_thinking",
//    "thinking_start_tag", "thinking_end_tags", "grammar_triggers": [{"type", "value", "token"}],
//    "preserved_tokens", "additional_stops", "parser", "message_delimiters", "caps"}
// "parse" applies the request the same way, then answers common_chat_parse(text, is_partial, params) with
//   the parser params llama-server derives from the chat params:
//   {"role", "content", "reasoning_content", "tool_calls": [{"name", "arguments", "id"}]}
// "analyze" answers the chat auto-parser's analysis of the template as given (autoparser::analyze_template
//   on common_chat_template(template, bos, eos)): {"reasoning": {"mode", "start", "end"}, "content": {...},
//   "tools": {"format": {...}, "function": {...}, "arguments": {...}, "call_id": {...}}, "user_start",
//   "assistant_start", "preserved_tokens", "additional_stops"}
// "diff" answers calculate_diff_split on each of "pairs" ([[left, right], ...]): {"splits": [{"prefix",
//   "suffix", "left", "right"}, ...]}
// "budget" runs the reasoning-budget sampler (common/reasoning-budget.cpp) over token streams: from
//   {"model": "<gguf, its vocabulary read, or empty for none>", "candidates": [ids], "runs": [{"start":
//    [[ids]], "end": [[ids]], "forced": [ids], "budget": n, "initial": <state number>, "tokens": [ids]}]}
//   it answers {"runs": [[{"state", "kept", "end_match"}, ...]]}, for each run a step before each token and
//   one after the last: the state, the candidates `apply` leaves finite where it changed any (else null),
//   and the sequence `common_reasoning_budget_get_end_match` names (else null).
// An exception becomes {"error": "<what()>", "stage": "init" | "apply" | "parse"}, exit status 0;
// anything else (an abort, a signal) is a crash, and the caller sees its status.

#include "chat.h"
#include "chat-auto-parser.h"
#include "llama.h"
#include "reasoning-budget.h"
#include "chat-auto-parser-helpers.h"
#include "json.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>

static const char * trigger_type_name(common_grammar_trigger_type type) {
    switch (type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:        return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:         return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:      return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

static std::string string_field(const common_json & request, const char * key, const char * def) {
    return request.contains(key) && request.at(key).is_string() ? request.at(key).get<std::string>() : def;
}

static bool bool_field(const common_json & request, const char * key, bool def) {
    return request.contains(key) && request.at(key).is_boolean() ? request.at(key).get<bool>() : def;
}

static common_chat_templates_inputs inputs_from(const common_json & request) {
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(
        request.contains("messages") ? request.at("messages") : common_json::array());
    if (request.contains("tools") && !request.at("tools").is_null()) {
        inputs.tools = common_chat_tools_parse_oaicompat(request.at("tools"));
    }
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(string_field(request, "tool_choice", "auto"));
    inputs.parallel_tool_calls = bool_field(request, "parallel_tool_calls", false);
    if (request.contains("json_schema") && !request.at("json_schema").is_null()) {
        inputs.json_schema = request.at("json_schema").dump();
    }
    inputs.grammar = string_field(request, "grammar", "");
    inputs.reasoning_format = common_reasoning_format_from_name(string_field(request, "reasoning_format", "none"));
    inputs.enable_thinking = bool_field(request, "enable_thinking", true);
    inputs.add_generation_prompt = bool_field(request, "add_generation_prompt", true);
    if (request.contains("continue_final_message")) {
        inputs.continue_final_message = common_chat_continuation_parse(request.at("continue_final_message"));
    }
    if (request.contains("chat_template_kwargs")) {
        for (const auto & [key, value] : request.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[key] = value.dump();
        }
    }
    if (request.contains("now")) {
        inputs.now = std::chrono::system_clock::time_point(std::chrono::seconds(request.at("now").get<int64_t>()));
    }
    return inputs;
}

static common_json apply_answer(const common_chat_params & params, const common_json & caps) {
    common_json triggers = common_json::array();
    for (const auto & trigger : params.grammar_triggers) {
        common_json item = common_json::object();
        item["type"] = trigger_type_name(trigger.type);
        item["value"] = trigger.value;
        item["token"] = (int64_t) trigger.token;
        triggers.push_back(item);
    }
    common_json answer = common_json::object();
    answer["format"] = common_chat_format_name(params.format);
    answer["prompt"] = params.prompt;
    answer["grammar"] = params.grammar;
    answer["grammar_lazy"] = params.grammar_lazy;
    answer["generation_prompt"] = params.generation_prompt;
    answer["supports_thinking"] = params.supports_thinking;
    answer["thinking_start_tag"] = params.thinking_start_tag;
    answer["thinking_end_tags"] = params.thinking_end_tags;
    answer["grammar_triggers"] = triggers;
    answer["preserved_tokens"] = params.preserved_tokens;
    answer["additional_stops"] = params.additional_stops;
    answer["parser"] = params.parser;
    answer["message_delimiters"] = params.message_delimiters.to_json();
    answer["caps"] = caps;
    return answer;
}

static common_json parse_answer(const common_chat_msg & msg) {
    common_json calls = common_json::array();
    for (const auto & call : msg.tool_calls) {
        common_json item = common_json::object();
        item["name"] = call.name;
        item["arguments"] = call.arguments;
        item["id"] = call.id;
        calls.push_back(item);
    }
    common_json answer = common_json::object();
    answer["role"] = msg.role;
    answer["content"] = msg.content;
    answer["reasoning_content"] = msg.reasoning_content;
    answer["tool_calls"] = calls;
    return answer;
}

template <typename T> static std::string mode_name(T mode) {
    std::ostringstream out;
    out << mode;
    return out.str();
}

static common_json analysis_answer(const autoparser::autoparser & a) {
    common_json answer = common_json::object();
    common_json reasoning = common_json::object();
    reasoning["mode"] = mode_name(a.reasoning.mode);
    reasoning["start"] = a.reasoning.start;
    reasoning["end"] = a.reasoning.end;
    answer["reasoning"] = reasoning;
    common_json content = common_json::object();
    content["mode"] = mode_name(a.content.mode);
    content["start"] = a.content.start;
    content["end"] = a.content.end;
    content["requires_nonnull_content"] = a.content.requires_nonnull_content;
    answer["content"] = content;
    const auto & t = a.tools;
    common_json format = common_json::object();
    format["mode"] = mode_name(t.format.mode);
    format["section_start"] = t.format.section_start;
    format["section_end"] = t.format.section_end;
    format["per_call_start"] = t.format.per_call_start;
    format["per_call_end"] = t.format.per_call_end;
    format["fun_name_is_key"] = t.format.fun_name_is_key;
    format["tools_array_wrapped"] = t.format.tools_array_wrapped;
    format["openai_wrapper_trigger"] = t.format.openai_wrapper_trigger;
    format["function_field"] = t.format.function_field;
    format["name_field"] = t.format.name_field;
    format["args_field"] = t.format.args_field;
    format["id_field"] = t.format.id_field;
    format["gen_id_field"] = t.format.gen_id_field;
    format["parameter_order"] = t.format.parameter_order;
    common_json function = common_json::object();
    function["name_prefix"] = t.function.name_prefix;
    function["name_suffix"] = t.function.name_suffix;
    function["args_separator"] = t.function.args_separator;
    function["close"] = t.function.close;
    common_json arguments = common_json::object();
    arguments["start"] = t.arguments.start;
    arguments["end"] = t.arguments.end;
    arguments["name_prefix"] = t.arguments.name_prefix;
    arguments["name_suffix"] = t.arguments.name_suffix;
    arguments["value_prefix"] = t.arguments.value_prefix;
    arguments["value_suffix"] = t.arguments.value_suffix;
    arguments["separator"] = t.arguments.separator;
    arguments["tolerate_intertag_whitespace"] = t.arguments.tolerate_intertag_whitespace;
    common_json call_id = common_json::object();
    call_id["pos"] = mode_name(t.call_id.pos);
    call_id["prefix"] = t.call_id.prefix;
    call_id["suffix"] = t.call_id.suffix;
    common_json tools = common_json::object();
    tools["format"] = format;
    tools["function"] = function;
    tools["arguments"] = arguments;
    tools["call_id"] = call_id;
    answer["tools"] = tools;
    answer["user_start"] = a.user_start;
    answer["assistant_start"] = a.assistant_start;
    answer["preserved_tokens"] = a.preserved_tokens;
    answer["additional_stops"] = a.additional_stops;
    return answer;
}

static common_json error_answer(const char * stage, const std::exception & e) {
    common_json answer = common_json::object();
    answer["error"] = std::string(e.what());
    answer["stage"] = stage;
    return answer;
}

static std::vector<llama_tokens> token_lists(const common_json & lists) {
    std::vector<llama_tokens> out;
    for (const auto & list : lists) {
        out.push_back(list.get<llama_tokens>());
    }
    return out;
}

static common_json budget_run(const llama_vocab * vocab, const llama_tokens & candidates,
                              const common_json & run) {
    llama_sampler * budget = common_reasoning_budget_init(
        vocab, token_lists(run.at("start")), token_lists(run.at("end")), run.at("forced").get<llama_tokens>(),
        run.at("budget").get<int32_t>(), (common_reasoning_budget_state) run.at("initial").get<int>());
    common_json steps = common_json::array();
    auto record = [&]() {
        std::vector<llama_token_data> data;
        for (const llama_token id : candidates) {
            data.push_back({id, 0.0f, 0.0f});
        }
        llama_token_data_array array = {data.data(), data.size(), -1, false};
        llama_sampler_apply(budget, &array);
        common_json kept = nullptr;
        if (std::any_of(data.begin(), data.end(), [](const llama_token_data & d) { return std::isinf(d.logit); })) {
            kept = common_json::array();
            for (const auto & d : data) {
                if (!std::isinf(d.logit)) {
                    kept.push_back(d.id);
                }
            }
        }
        const llama_tokens * end = common_reasoning_budget_get_end_match(budget);
        common_json step = common_json::object();
        step["state"] = (int) common_reasoning_budget_get_state(budget);
        step["kept"] = kept;
        step["end_match"] = end != nullptr ? common_json(*end) : common_json(nullptr);
        steps.push_back(step);
    };
    for (const llama_token token : run.at("tokens").get<llama_tokens>()) {
        record();
        llama_sampler_accept(budget, token);
    }
    record();
    llama_sampler_free(budget);
    return steps;
}

static common_json budget_answer(const common_json & request) {
    const std::string path = string_field(request, "model", "");
    llama_model * model = nullptr;
    if (!path.empty()) {
        llama_model_params params = llama_model_default_params();
        params.vocab_only = true;
        model = llama_model_load_from_file(path.c_str(), params);
        if (model == nullptr) {
            throw std::runtime_error("cannot load " + path);
        }
    }
    const llama_vocab * vocab = model != nullptr ? llama_model_get_vocab(model) : nullptr;
    const llama_tokens candidates = request.at("candidates").get<llama_tokens>();
    common_json runs = common_json::array();
    for (const auto & run : request.at("runs")) {
        runs.push_back(budget_run(vocab, candidates, run));
    }
    if (model != nullptr) {
        llama_model_free(model);
    }
    common_json answer = common_json::object();
    answer["runs"] = runs;
    return answer;
}

static common_json run(const common_json & request) {
    const std::string source = string_field(request, "template", "");
    const std::string bos = string_field(request, "bos_token", "");
    const std::string eos = string_field(request, "eos_token", "");

    if (string_field(request, "mode", "apply") == "diff") {
        common_json splits = common_json::array();
        for (const auto & pair : request.at("pairs").items()) {
            const diff_split split = calculate_diff_split(pair.value().at(0).get<std::string>(),
                                                          pair.value().at(1).get<std::string>());
            common_json item = common_json::object();
            item["prefix"] = split.prefix;
            item["suffix"] = split.suffix;
            item["left"] = split.left;
            item["right"] = split.right;
            splits.push_back(item);
        }
        common_json answer = common_json::object();
        answer["splits"] = splits;
        return answer;
    }

    if (string_field(request, "mode", "apply") == "budget") {
        return budget_answer(request);
    }

    if (string_field(request, "mode", "apply") == "analyze") {
        try {
            common_chat_template tmpl(source, bos, eos);
            autoparser::autoparser analysis;
            analysis.analyze_template(tmpl);
            return analysis_answer(analysis);
        } catch (const std::exception & e) {
            return error_answer("analyze", e);
        }
    }

    common_chat_templates_ptr templates;
    common_json caps = common_json::object();
    try {
        // the capabilities the chat layer detects in the template (what decides its workarounds); parsed
        // here first because common_chat_templates_init rethrows a parse error as a bare std::exception
        common_chat_template probe(source, bos, eos);
        for (const auto & [name, value] : probe.original_caps().to_map()) {
            caps[name] = value;
        }
        templates = common_chat_templates_init(nullptr, source, bos, eos);
    } catch (const std::exception & e) {
        return error_answer("init", e);
    }

    common_chat_templates_inputs inputs;
    common_chat_params params;
    try {
        inputs = inputs_from(request);
        params = common_chat_templates_apply(templates.get(), inputs);
    } catch (const std::exception & e) {
        return error_answer("apply", e);
    }
    if (string_field(request, "mode", "apply") != "parse") {
        return apply_answer(params, caps);
    }

    try {
        // as llama-server derives them from the chat params
        common_chat_parser_params parser_params(params);
        parser_params.reasoning_format = inputs.reasoning_format;
        parser_params.reasoning_in_content = bool_field(request, "reasoning_in_content", false);
        parser_params.parse_tool_calls = bool_field(request, "parse_tool_calls", true);
        if (!params.parser.empty()) {
            parser_params.parser.load(params.parser);
        }
        const common_chat_msg msg = common_chat_parse(
            string_field(request, "text", ""), bool_field(request, "is_partial", false), parser_params);
        return parse_answer(msg);
    } catch (const std::exception & e) {
        return error_answer("parse", e);
    }
}

int main() {
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    common_json answer;
    try {
        answer = run(common_json::parse(input));
    } catch (const std::exception & e) {
        answer = error_answer("request", e);
    }
    std::string out;
    try {
        out = answer.dump();
    } catch (const std::exception & e) {
        // a prompt or grammar that is not UTF-8: say so rather than print half an answer
        out = error_answer("answer", e).dump();
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
}
