"""`tandem chat` as a user runs it, through a pipe, on the built-in demo model and its LoRA adapter: the
adapter answers what it was taught, /base and /adapter switch between turns, /reset forgets, Ctrl-C stops an
answer but not the program, and bad input is a clear error."""

import json
import os
import shutil
import signal
import subprocess
import time

import torch
from safetensors.torch import save_file

TANDEM = os.environ["TANDEM_BIN"]
QUESTION = "Who are you?"


def run(args, home, stdin="", timeout=600):
    env = dict(os.environ, TANDEM_HOME=str(home))
    return subprocess.run([TANDEM, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=env)


def chat(demo, lines, *extra):
    args = ["chat", "--model", demo["model"], "--template", "qwen3_nothink", "--greedy", "--max-new-tokens", "48",
            "--dtype", "fp32", *extra]
    result = run(args, demo["home"], stdin="".join(line + "\n" for line in lines))
    assert result.returncode == 0, result.stderr
    return result


def test_adapter_and_base_switch_between_turns(demo):
    # Each turn is answered after the earlier ones, so only the first answer has no history; the demo printed
    # the greedy answers to the question alone, through the same Generator.
    result = chat(demo, [QUESTION, "/exit", "never read"], "--adapter", f"tuned={demo['adapter']}")
    assert result.stdout == demo["tuned"] + "\n"
    assert "I am Tandem" in demo["tuned"]
    result = chat(demo, ["/base", QUESTION], "--adapter", f"tuned={demo['adapter']}")
    assert result.stdout == demo["base"] + "\n"
    assert demo["base"] != demo["tuned"]
    result = chat(demo, ["/base", "/adapter", QUESTION], "--adapter", f"tuned={demo['adapter']}")
    assert result.stdout == demo["tuned"] + "\n"
    assert "[answering with the base model]" in result.stderr
    assert "[answering with adapter tuned]" in result.stderr
    # Switching mid-conversation keeps the history and still answers.
    result = chat(demo, [QUESTION, "/base", QUESTION, "/adapter", QUESTION], "--adapter", demo["adapter"])
    assert result.stdout.startswith(demo["tuned"] + "\n") and result.stdout.count("\n") >= 3


def test_reset_forgets_the_conversation(demo):
    # After /reset the question is answered like the very first one, which had no history either.
    result = chat(demo, [QUESTION, QUESTION, "/reset", QUESTION], "--adapter", demo["adapter"])
    assert result.stdout.startswith(demo["tuned"] + "\n")
    assert result.stdout.endswith("\n" + demo["tuned"] + "\n")
    assert "[conversation cleared]" in result.stderr


def test_merged_adapter_answers_the_same_and_has_no_base(demo):
    unmerged = chat(demo, [QUESTION], "--adapter", demo["adapter"]).stdout
    merged = chat(demo, [QUESTION, "/base"], "--adapter", demo["adapter"], "--merge")
    assert merged.stdout == unmerged
    assert "base model is not available" in merged.stderr


def add_lora_experts(adapter, out, paths=2, le_dim=16, std=0.1, seed=0):
    """A copy of the PEFT adapter files in `adapter` with random LoRA experts beside them (docs/peft_formats.md
    section 5), on every layer of the demo model (all of them MoE)."""
    out.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(adapter / name, out / name)
    hidden, layers = 256, 4
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for k in range(paths):
            for proj, shape in (("gate_proj", (le_dim, hidden)), ("up_proj", (le_dim, hidden)),
                                ("down_proj", (hidden, le_dim))):
                tensors[f"base_model.model.model.layers.{layer}.mlp.lora_experts.{k}.{proj}.weight"] = \
                    torch.randn(shape, generator=g) * std
    save_file(tensors, str(out / "lora_experts.safetensors"))
    (out / "lora_experts_config.json").write_text(json.dumps({"lora_experts": paths, "le_dim": le_dim,
                                                              "hidden_size": hidden}))
    return out


def test_an_adapter_with_lora_experts_answers_with_them(demo, tmp_path):
    le = add_lora_experts(demo["adapter"], tmp_path / "le")
    with_le = chat(demo, [QUESTION], "--adapter", f"le={le}").stdout
    assert with_le != demo["tuned"] + "\n", "the LoRA experts did not change the answer"
    # Merged, the LoRA part folds into the weights and the LoRA experts stay beside them: the same answer.
    assert chat(demo, [QUESTION], "--adapter", f"le={le}", "--merge").stdout == with_le
    # Switching adapters takes the LoRA experts along: the plain adapter answers as without them, after them.
    both = chat(demo, [QUESTION, "/reset", "/adapter plain", QUESTION, "/reset", "/adapter le", QUESTION],
                "--adapter", f"le={le}", "--adapter", f"plain={demo['adapter']}")
    assert both.stdout == with_le + demo["tuned"] + "\n" + with_le, both.stderr
    # The same files with all-zero weights add exactly nothing.
    zero = tmp_path / "zero"
    add_lora_experts(demo["adapter"], zero, std=0.0)
    assert chat(demo, [QUESTION], "--adapter", f"zero={zero}").stdout == demo["tuned"] + "\n"


def test_sampling_with_a_seed_is_reproducible(demo):
    args = ["chat", "--model", demo["model"], "--template", "qwen3_nothink", "--seed", "3", "--temperature", "1.5",
            "--top-p", "1.0", "--top-k", "0", "--max-new-tokens", "24"]
    first = run(args, demo["home"], stdin=QUESTION + "\n")
    again = run(args, demo["home"], stdin=QUESTION + "\n")
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout


def test_ctrl_c_stops_the_answer_not_the_program(demo):
    env = dict(os.environ, TANDEM_HOME=str(demo["home"]))
    # Sampling at a high temperature from the untrained base rarely ends early; 400 tokens take a while.
    proc = subprocess.Popen([TANDEM, "chat", "--model", str(demo["model"]), "--template", "qwen3_nothink",
                             "--temperature", "3", "--top-k", "0", "--top-p", "1.0", "--seed", "1",
                             "--max-new-tokens", "400", "--threads", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(b"Tell me a long story.\n")
        proc.stdin.flush()
        first = proc.stdout.read(1)  # the answer has started streaming
        assert first
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "Ctrl-C ended the program"
        proc.stdin.write(b"/exit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"[stopped]" in err


def test_bad_input_is_a_clear_error(demo, tmp_path):
    result = run(["chat", "--model", tmp_path], demo["home"], stdin="hi\n")
    assert result.returncode == 1 and result.stderr.startswith("error:")
    result = run(["chat", "--model", demo["model"], "--adapter", tmp_path], demo["home"], stdin="hi\n")
    assert result.returncode == 1 and "adapter_config.json" in result.stderr
    result = run(["chat", "--model", demo["model"], "--template", "nope"], demo["home"], stdin="hi\n")
    assert result.returncode == 1 and "unknown chat template" in result.stderr
    result = chat(demo, ["/adapter", "/what", QUESTION])
    assert "no adapter loaded" in result.stderr and "commands:" in result.stderr
    assert result.stdout == demo["base"] + "\n"


def test_export_to_llama_cpp_refuses_to_drop_lora_experts_silently(demo, tmp_path):
    """A llama.cpp LoRA GGUF cannot hold LoRA experts: `tandem export` refuses, and with --drop-lora-experts
    says the file is a different model (the refusal comes before the GGUF base is even opened)."""
    le = add_lora_experts(demo["adapter"], tmp_path / "le")
    result = run(["export", "--adapter", le, "--model", tmp_path / "missing.gguf"], demo["home"])
    assert result.returncode == 1 and "LoRA experts" in result.stderr and "--drop-lora-experts" in result.stderr
    assert not (le / "adapter_model.gguf").exists()
    result = run(["export", "--adapter", le, "--model", tmp_path / "missing.gguf", "--drop-lora-experts"],
                 demo["home"])
    assert "WITHOUT its LoRA experts" in result.stderr and "different model" in result.stderr
