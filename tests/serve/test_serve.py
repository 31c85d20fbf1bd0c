"""`tandem serve` driven by the official `openai` Python client, on a small random Qwen3-MoE with the demo's
tokenizer and a PEFT adapter (both made here with transformers + peft). Greedy answers are checked token for
token against transformers' generate (through peft for the adapter); the error paths against the status codes
and bodies OpenAI uses, each followed by a request that must still be served."""

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO = REPO / "resources" / "demo"
API_KEY = "test-key-123"
MAX_BODY = 64 * 1024
MAX_TOKENS_LIMIT = 2048
CONTEXT = 4096
QUESTION = "Who are you?"


def prompt_text(question):
    # LLaMA-Factory's qwen3_nothink template, one user turn, ready for the assistant's reply.
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def fixture_dirs(tmp_path_factory):
    """A random Qwen3-MoE (the demo's shapes, smaller) and a random-B LoRA adapter on its attention."""
    from peft import LoraConfig, get_peft_model
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    root = tmp_path_factory.mktemp("serve")
    model_dir, adapter_dir = root / "model", root / "adapter"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, model_dir / name)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    vocab = max(tok.get_vocab().values()) + 1
    config = Qwen3MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=CONTEXT,
                            rope_theta=10000.0, tie_word_embeddings=False,
                            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # wider weights than the 0.02 init, so greedy answers are not one repeated token
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    model.save_pretrained(str(model_dir))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)
    torch.manual_seed(1)
    get_peft_model(model, lora).save_pretrained(str(adapter_dir))
    return {"model": model_dir, "adapter": adapter_dir, "eos": config.eos_token_id}


@pytest.fixture(scope="module")
def reference(fixture_dirs):
    """Greedy continuations from transformers (base) and transformers + peft (adapter), fp32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(fixture_dirs["model"] / "tokenizer.json"))
    ids = tok(prompt_text(QUESTION))["input_ids"]
    eos = fixture_dirs["eos"]

    def greedy(model, n):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)[0, len(ids):].tolist()
        finish = "stop" if out and out[-1] == eos else "length"
        text = tok.decode([t for t in out if t != eos], skip_special_tokens=True)
        return {"ids": out, "text": text, "finish": finish}

    base = AutoModelForCausalLM.from_pretrained(str(fixture_dirs["model"]), dtype=torch.float32)
    result = {"prompt_ids": ids, "base": greedy(base, 24)}
    tuned = PeftModel.from_pretrained(base, str(fixture_dirs["adapter"]))
    result["tuned"] = greedy(tuned, 24)
    return result


class Server:
    def __init__(self, fixture_dirs, tmp_path_factory, adapters=None):
        log_dir = tmp_path_factory.mktemp("serve-log")
        self.log_path = log_dir / "server.log"
        self.log = open(self.log_path, "w")
        adapters = adapters or {"tuned": fixture_dirs["adapter"]}
        adapter_args = [a for name, d in adapters.items() for a in ("--adapter", f"{name}={d}")]
        self.proc = subprocess.Popen(
            [TANDEM, "serve", "--model", str(fixture_dirs["model"]), *adapter_args,
             "--template", "qwen3_nothink", "--dtype", "fp32", "--port", "0", "--api-key", API_KEY, "--max-body-bytes", str(MAX_BODY),
             "--max-tokens-limit", str(MAX_TOKENS_LIMIT), "--queue", "8", "--threads", "2"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            if match:
                self.port = int(match.group(1))
                break
        assert self.port, "tandem serve did not start: " + self.log_path.read_text()[-3000:]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.base_url, api_key=API_KEY, max_retries=0, timeout=120)

    def raw(self, path, body=None, headers=None, method=None):
        """One HTTP request without the openai client: (status, parsed JSON body)."""
        data = body if isinstance(body, bytes) or body is None else body.encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as res:
                return res.status, json.loads(res.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def chat(self, model="base", question=QUESTION, **kw):
        return self.client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], **kw)


@pytest.fixture(scope="module")
def server(fixture_dirs, tmp_path_factory):
    s = Server(fixture_dirs, tmp_path_factory)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def assert_still_serving(server, reference):
    answer = server.chat(max_tokens=24, temperature=0)
    assert answer.choices[0].message.content == reference["base"]["text"]


def test_models_lists_base_and_each_adapter(server):
    assert [m.id for m in server.client.models.list().data] == ["base", "tuned"]
    assert server.client.models.retrieve("tuned").id == "tuned"
    with pytest.raises(openai.NotFoundError):
        server.client.models.retrieve("gpt-4o")
    assert server.raw("/health", method="GET") == (200, {"status": "ok"})


@pytest.mark.parametrize("model", ["base", "tuned"])
def test_greedy_answer_equals_transformers_generate(server, reference, model):
    answer = server.chat(model=model, max_tokens=24, temperature=0)
    ref = reference[model]
    assert answer.model == model
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == ref["text"]
    assert answer.choices[0].finish_reason == ref["finish"]
    assert answer.usage.prompt_tokens == len(reference["prompt_ids"])
    assert answer.usage.completion_tokens == len(ref["ids"])
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_greedy_answers_equal_tandem_chat(server, fixture_dirs):
    """The server and the terminal chat are two faces of one Generator: same prompt, same answer."""
    script = f"{QUESTION}\n/reset\n/base\n{QUESTION}\n"
    chat = subprocess.run([TANDEM, "chat", "--model", str(fixture_dirs["model"]), "--adapter",
                           f"tuned={fixture_dirs['adapter']}", "--template", "qwen3_nothink", "--dtype", "fp32",
                           "--greedy", "--max-new-tokens", "24", "--threads", "2"],
                          input=script, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr
    served = [server.chat(model=m, max_tokens=24, temperature=0).choices[0].message.content for m in ("tuned", "base")]
    assert chat.stdout == served[0] + "\n" + served[1] + "\n"


def test_the_adapter_changes_the_greedy_answer(server, reference):
    assert reference["base"]["ids"] != reference["tuned"]["ids"]  # the fixture makes the comparison meaningful
    base = server.chat(model="base", max_tokens=24, temperature=0).choices[0].message.content
    tuned = server.chat(model="tuned", max_tokens=24, temperature=0).choices[0].message.content
    assert base != tuned


def test_streamed_answer_is_the_plain_answer_in_pieces(server, reference):
    chunks = list(server.chat(model="tuned", max_tokens=24, temperature=0, stream=True,
                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference["tuned"]["text"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [reference["tuned"]["finish"]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(reference["tuned"]["ids"])
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # really streamed


def test_sampling_with_a_seed_is_reproducible(server):
    def sample(seed):
        return server.chat(max_tokens=16, temperature=1.0, top_p=0.95, seed=seed).choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1  # seeds matter, so sampling happens


def test_stop_string_ends_the_answer_before_it(server, reference):
    full = reference["base"]["text"]
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), f"pick another stop in {full!r}"
    answer = server.chat(max_tokens=24, temperature=0, stop=[stop, "never-there"])
    assert answer.choices[0].message.content == full[:full.find(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_bad_requests_get_the_right_4xx_and_the_server_keeps_serving(server, reference):
    status, body = server.raw("/v1/chat/completions", '{"model": "base", "messages": [')
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "invalid_json"
    assert_still_serving(server, reference)

    status, body = server.raw("/v1/chat/completions", '{"model": "base", "messages": "hello"}')
    assert status == 400 and body["error"]["param"] == "messages"

    with pytest.raises(openai.NotFoundError) as e:
        server.chat(model="gpt-4o")
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    assert_still_serving(server, reference)

    with pytest.raises(openai.BadRequestError) as e:
        server.chat(max_tokens=10_000_000)
    assert e.value.status_code == 400 and e.value.param == "max_tokens"
    assert str(MAX_TOKENS_LIMIT) in e.value.message
    long_question = "word " * (CONTEXT - MAX_TOKENS_LIMIT)  # with max_tokens at the limit, beyond the context
    with pytest.raises(openai.BadRequestError) as e:
        server.chat(max_tokens=MAX_TOKENS_LIMIT, question=long_question)
    assert e.value.code == "context_length_exceeded" and str(CONTEXT) in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        server.chat(n=2)
    assert e.value.param == "n"
    assert_still_serving(server, reference)

    wrong = openai.OpenAI(base_url=server.base_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 401
    status, _ = server.raw("/v1/models", method="GET", headers={"Authorization": ""})
    assert status == 401
    assert_still_serving(server, reference)

    big = json.dumps({"model": "base", "messages": [{"role": "user", "content": "a" * (2 * MAX_BODY)}]})
    status, body = server.raw("/v1/chat/completions", big)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert_still_serving(server, reference)


def test_concurrent_requests_are_queued_and_all_answered(server, reference):
    results = [None] * 4

    def ask(i):
        model = "tuned" if i % 2 else "base"
        results[i] = (model, server.chat(model=model, max_tokens=24, temperature=0).choices[0].message.content)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, text in results:
        assert text == reference[model]["text"]


def test_a_client_leaving_a_stream_cancels_its_generation(server, reference):
    # Greedy on this model runs to max_tokens without an eos: seconds, so the server is still
    # generating when the client leaves.
    stream = server.chat(max_tokens=MAX_TOKENS_LIMIT, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.time() + 60
    while "cancelled" not in server.log_path.read_text() and time.time() < deadline:
        time.sleep(0.1)
    assert "cancelled" in server.log_path.read_text()
    assert_still_serving(server, reference)


def test_sigterm_stops_the_server_cleanly(server):
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0


def test_an_adapter_with_lora_experts_is_served_with_them(fixture_dirs, reference, tmp_path_factory):
    """LoRA experts (issue 32) saved beside the adapter are served: the answer differs from the same adapter
    without them, equals `tandem chat`'s with them, and switching back to the plain adapter and the base drops
    them."""
    le = tmp_path_factory.mktemp("le") / "adapter"
    shutil.copytree(fixture_dirs["adapter"], le)
    g = torch.Generator().manual_seed(0)
    hidden, le_dim, paths = 64, 16, 2
    tensors = {f"base_model.model.model.layers.{layer}.mlp.lora_experts.{k}.{proj}.weight":
               torch.randn(shape, generator=g) * 0.3
               for layer in range(2) for k in range(paths)
               for proj, shape in (("gate_proj", (le_dim, hidden)), ("up_proj", (le_dim, hidden)),
                                   ("down_proj", (hidden, le_dim)))}
    save_file(tensors, str(le / "lora_experts.safetensors"))
    (le / "lora_experts_config.json").write_text(json.dumps({"lora_experts": paths, "le_dim": le_dim,
                                                             "hidden_size": hidden}))
    s = Server(fixture_dirs, tmp_path_factory, adapters={"tuned": fixture_dirs["adapter"], "le": le})
    try:
        answer = lambda m: s.chat(model=m, max_tokens=24, temperature=0).choices[0].message.content  # noqa: E731
        with_le = answer("le")
        assert with_le != reference["tuned"]["text"]
        assert answer("tuned") == reference["tuned"]["text"]
        assert answer("base") == reference["base"]["text"]
        assert answer("le") == with_le
        chat = subprocess.run([TANDEM, "chat", "--model", str(fixture_dirs["model"]), "--adapter", f"le={le}",
                               "--template", "qwen3_nothink", "--dtype", "fp32", "--greedy", "--max-new-tokens", "24",
                               "--threads", "2"], input=f"{QUESTION}\n", capture_output=True, text=True, timeout=300)
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout == with_le + "\n"
    finally:
        s.proc.kill()
        s.proc.wait()

