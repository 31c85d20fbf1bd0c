"""`tandem chat` as a user runs it, through a pipe, on the built-in demo model and its LoRA adapter: the
adapter answers what it was taught, /base and /adapter switch between turns, /reset forgets, Ctrl-C stops an
answer but not the program, and bad input is a clear error."""

import os
import signal
import subprocess
import time

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
