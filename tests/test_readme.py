"""The README's Python examples work as written: each block runs, and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests import reference
from tests.server.running import ServerProcess, socket_dir

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
README_SOCKET = "unix:///tmp/constraintd.sock"


def run(code: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    return out.getvalue().splitlines()


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 4
    assert README_SOCKET in BLOCKS[1]


def test_engine_example() -> None:
    assert run(BLOCKS[0]) == ["False False", "[3]", "True True True"]


def test_client_example_against_a_real_server() -> None:
    with socket_dir() as directory:
        server = ServerProcess(directory / "constraintd.sock").start()
        try:
            lines = run(BLOCKS[1].replace(README_SOCKET, server.target))
        finally:
            server.kill()
    assert lines == ["False [3] True True"]


def test_chat_session_example() -> None:
    # the block's two files, from the reference data
    code = BLOCKS[2].replace('"ggml-vocab-qwen2.gguf"', repr(str(reference.vocab_path("qwen2"))))
    template = reference.llama_cpp_dir() / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    code = code.replace('"qwen2.5.jinja"', repr(str(reference.require(template))))
    assert run(code) == [
        "False b'<|im_start|>assistant\\n'",
        """(ParsedToolCall(name='get_weather', arguments='{"city": "Paris"}', id=''),)""",
    ]


def test_mask_ahead_example() -> None:
    assert run(BLOCKS[3]) == ["True False", "True False True"]
