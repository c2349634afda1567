"""The llama.cpp the set-up installs runs on every machine of this project's kind (tests/llama_wheel.sh).

A build for the build machine's own CPU (llama.cpp's default, GGML_NATIVE) used AMX tile instructions that
a virtual machine advertised but did not allow, and the model died with SIGILL. The installed library must
report the portable baseline: AVX2, FMA and F16C on, and no AVX-512 or AMX code compiled in.
"""

from __future__ import annotations

import re

import llama_cpp


def features() -> dict[str, str]:
    info = llama_cpp.llama_print_system_info().decode()
    return dict(re.findall(r"([A-Z0-9_]+) = (\d+)", info))


def test_the_baseline_is_compiled_in() -> None:
    found = features()
    baseline = ("AVX2", "FMA", "F16C")
    assert {name: found.get(name) for name in baseline} == dict.fromkeys(baseline, "1")


def test_nothing_past_the_baseline_is_compiled_in() -> None:
    found = features()
    past = ("AVX512", "AMX", "AVX_VNNI")
    beyond = {name: on for name, on in found.items() if name.startswith(past) and on != "0"}
    assert found and beyond == {}


def test_the_installed_wheel_is_the_one_the_set_up_built() -> None:
    from importlib.metadata import distribution

    origin = distribution("llama-cpp-python").read_text("direct_url.json") or ""
    assert re.search(r"wheels/llama-cpp-python-0\.3\.36-cp\d+-\w+-[0-9a-f]{16}/", origin), origin
