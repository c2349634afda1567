"""With one slot, a seeded request to `sampler-worker serve` generates exactly the tokens of `sampler-worker
generate` with the same prompt, settings and constraint: token ids compared, whole and streamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sampler_worker.cli import main
from tests.sampler_worker.serve.conftest import ANSWER_GRAMMAR, QUESTION

# (command-line options, the same settings as request fields)
CASES = [
    (["--seed", "3"], {"seed": 3}),
    (["--seed", "11", "--temp", "1.2", "--top-k", "20", "--top-p", "0.9", "--repeat-penalty", "1.3"],
     {"seed": 11, "temperature": 1.2, "top_k": 20, "top_p": 0.9, "repeat_penalty": 1.3}),
]


@pytest.mark.slow  # the command loads the model again
@pytest.mark.parametrize(("options", "fields"), CASES, ids=["defaults", "warm-penalised"])
def test_a_seeded_request_is_the_generate_commands_tokens(
    http: httpx.Client, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    options: list[str], fields: dict[str, Any],
) -> None:
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text(ANSWER_GRAMMAR)
    status = main([
        "generate", "--model", str(gemma_path), "--chat", QUESTION, "--grammar", str(grammar),
        "--max-tokens", "12", "--n-ctx", "1024", "--constraintd", "local", "--output", "json", *options,
    ])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rejected_at"], "the grammar refused no first draw: the masked redraw went untested"

    request = {"messages": [{"role": "user", "content": QUESTION}], "grammar": ANSWER_GRAMMAR,
               "max_tokens": 12, "return_tokens": True, **fields}
    whole = http.post("/v1/chat/completions", json=request).json()
    assert whole["tokens"] == report["tokens"]
    assert whole["choices"][0]["message"]["content"] == report["text"]

    with http.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line and line != "data: [DONE]"]
    assert [token for chunk in chunks for token in chunk.get("tokens", [])] == report["tokens"]
