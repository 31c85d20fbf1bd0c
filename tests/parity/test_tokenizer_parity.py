"""Parity of tandem::io::Tokenizer with the PyPI `tokenizers` package: ids must be identical.

For each family (Qwen2/3, Llama-3, DeepSeek-V3; GPT-2 style byte-level and Llama-2/Mixtral style
SentencePiece BPE with byte fallback for extra coverage) a
tokenizer.json is built deterministically by tokenizer_fixtures.py; 12,000 generated strings
(multilingual text, emoji ZWJ sequences, code, long numbers, whitespace runs, contractions,
special tokens inside text, random code points from many blocks, combining marks) are encoded by
the C++ tool `tokenize_tool` and by `tokenizers`, with and without add_special_tokens. The ids and
decode(ids) (with and without skip_special_tokens) must match 100%.

The tool's path comes from $TANDEM_TOKENIZE_TOOL (set by ctest).
"""

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_fixtures as fixtures  # noqa: E402

N_STRINGS = 12000


@pytest.fixture(scope="module")
def tool():
    path = os.environ.get("TANDEM_TOKENIZE_TOOL")
    if not path:
        pytest.fail("set TANDEM_TOKENIZE_TOOL to the tokenize_tool executable")
    if not os.access(path, os.X_OK):
        pytest.fail(f"tokenize_tool not found or not executable: {path}")
    return path


def run_tool(tool, tokenizer_dir, items, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with open(inp, "w", encoding="utf-8") as f:
        for text, special in items:
            f.write(json.dumps({"text": text, "add_special_tokens": special}, ensure_ascii=False) + "\n")
    proc = subprocess.run([tool, str(tokenizer_dir), str(inp), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    print(proc.stderr.strip())
    with open(out, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("family", ["qwen2", "llama3", "deepseek_v3", "gpt2", "llama2"])
def test_ids_match_tokenizers(family, tool, tmp_path):
    tokenizer_dir = fixtures.write_family(family, tmp_path)
    reference = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    specials = fixtures.special_strings(json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8")))
    texts = fixtures.test_strings(N_STRINGS, seed=len(family) * 7919, specials=specials)
    items = [(t, i % 3 == 0) for i, t in enumerate(texts)]
    got = run_tool(tool, tokenizer_dir, items, tmp_path)
    assert len(got) == len(items)

    mismatches = []
    for (text, special), result in zip(items, got):
        ids = reference.encode(text, add_special_tokens=special).ids
        want = {"ids": ids, "decoded": reference.decode(ids, skip_special_tokens=False),
                "decoded_skip": reference.decode(ids, skip_special_tokens=True)}
        if result != want:
            mismatches.append((text, special, want, result))
    rate = 1 - len(mismatches) / len(items)
    print(f"{family}: {len(items) - len(mismatches)}/{len(items)} identical ({rate:.4%})")
    for text, special, want, result in mismatches[:5]:
        print(f"  text={text!r} special={special}\n    want={want}\n    got ={result}")
    assert not mismatches, f"{family}: {len(mismatches)} of {len(items)} strings differ (match rate {rate:.4%})"


def test_config_special_ids(tool, tmp_path):
    """eos/bos from tokenizer_config.json reach the encoder: BOS is prepended for DeepSeek-V3."""
    tokenizer_dir = fixtures.write_family("deepseek_v3", tmp_path)
    reference = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    got = run_tool(tool, tokenizer_dir, [("hi", True)], tmp_path)
    assert got[0]["ids"][0] == reference.token_to_id("<｜begin▁of▁sentence｜>")
