#!/usr/bin/env python3
"""Tokenisation throughput of Tandem's C++ byte-level BPE vs the `tokenizers` package, same run.

    python bench/data_pipeline_bench.py [--samples 24000] [--repeats 3] [--tool build/tests/tools/tokenize_tool]

Pipeline reproduced: a synthetic alpaca dataset (instruction / input / output; English, other
scripts, code, numbers, emoji) -> the qwen3_nothink chat template (LLaMA-Factory's strings, as in
engine/chat/chat_template.cpp) -> one rendered text per sample -> token ids. The same rendered
texts go to both tokenizers. Two tokenizers, both byte-level BPE with the Qwen2 pre-tokenizer
(NFC + Split(Qwen2 regex, Isolated) + ByteLevel):

* demo:  resources/demo/tokenizer.json (the bundled demo's real tokenizer, 786 tokens, 525 merges);
* qwen2_32k: tests/parity/tokenizer_fixtures.py's build_qwen2 trained to a 32k vocabulary (closer to
  the real Qwen2 151k vocabulary in merge-table size and token length).

Timings, each in a fresh process, interleaved, median of --repeats:

* tandem: build/tests/tools/tokenize_tool reports its own time summed over the encode() calls only
  (no start-up, no tokenizer load, no JSON, no decode): the headline number, single thread.
  Also, as a cross-check, the tool's marginal wall time: wall(all samples) - wall(first half),
  divided by the second half's samples; this includes the tool's JSON parse/dump and its two
  decode() calls per sample, so it is an upper bound on the encode cost.
* tokenizers (Rust, via Python): `encode(text, add_special_tokens=False)` in a Python loop (one
  thread); `encode_batch` with RAYON_NUM_THREADS=1; `encode_batch` with the default rayon pool
  (= nproc threads); `encode_batch_fast` (no offsets) at nproc threads. Timed around the encode
  calls only (tokenizer loaded and texts read beforehand).

Both start with empty word caches. The ids of both are compared (a mismatch would make the
comparison meaningless; it is reported). Prints one JSON object; ratio = tandem / tokenizers
throughput (> 1: Tandem faster).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "parity"))

# ----------------------------------------------------------------------------------- corpus

def make_dataset(n, seed=20261130):
    """n alpaca rows, deterministic. Mix: ~45% English prose, ~25% other scripts, ~20% code, ~10% mixed."""
    from tokenizer_fixtures import CODE, CONTRACTIONS, EMOJI, WORDS, random_number
    rng = random.Random(seed)
    langs = [l for l in WORDS if l != "en"]

    def sentence(lang):
        words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(4, 18))]
        if lang == "en" and rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(CONTRACTIONS))
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words)), random_number(rng))
        if rng.random() < 0.05:
            words.append(rng.choice(EMOJI))
        sep = "" if lang in ("zh", "ja") else " "
        end = "。" if lang in ("zh", "ja") else rng.choice([".", ".", ".", "?", "!", ":"])
        s = sep.join(words)
        return s[0].upper() + s[1:] + end

    def paragraph(lang, lo, hi):
        return " ".join(sentence(lang) for _ in range(rng.randint(lo, hi)))

    def code_block():
        body = "".join(rng.choice(CODE) + "\n" for _ in range(rng.randint(1, 6)))
        return f"```{rng.choice(['python', 'cpp', 'sql', 'rust', 'bash', ''])}\n{body}```"

    rows = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.45:
            lang = "en"
            instruction = sentence("en")
            inp = paragraph("en", 1, 3) if rng.random() < 0.4 else ""
            output = "\n\n".join(paragraph("en", 1, 5) for _ in range(rng.randint(1, 4)))
        elif kind < 0.70:
            lang = rng.choice(langs)
            instruction = sentence(lang)
            inp = paragraph(lang, 1, 2) if rng.random() < 0.3 else ""
            output = "\n".join(paragraph(lang, 1, 4) for _ in range(rng.randint(1, 3)))
        elif kind < 0.90:
            instruction = sentence("en")
            inp = code_block() if rng.random() < 0.5 else ""
            output = paragraph("en", 0, 2) + "\n\n" + code_block() + "\n" + paragraph("en", 0, 2)
        else:
            instruction = sentence(rng.choice(langs)) + " " + sentence("en")
            inp = ""
            output = " ".join(sentence(rng.choice(list(WORDS))) for _ in range(rng.randint(2, 10)))
        rows.append({"instruction": instruction, "input": inp, "output": output})
    return rows


def render_qwen3_nothink(row):
    """LLaMA-Factory's alpaca converter (instruction + "\\n" + input) through the qwen3_nothink template
    (Standard kind: no empty <think> block; efficient_eos is off, the eos is <|im_end|>)."""
    query = row["instruction"] + ("\n" + row["input"] if row["input"] else "")
    return (f"<|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n"
            f"{row['output']}<|im_end|>\n")


# ----------------------------------------------------------------------------------- workers

def worker(mode, tokenizer_path, texts_path, ids_out):
    """Runs in its own process (so RAYON_NUM_THREADS applies); prints {"encode_s": ...}."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    texts = [json.loads(l) for l in open(texts_path, encoding="utf-8")]
    t0 = time.perf_counter()
    if mode == "encode_loop":
        encs = [tok.encode(t, add_special_tokens=False) for t in texts]
    elif mode == "encode_batch":
        encs = tok.encode_batch(texts, add_special_tokens=False)
    elif mode == "encode_batch_fast":
        encs = tok.encode_batch_fast(texts, add_special_tokens=False)
    else:
        raise SystemExit(f"unknown mode {mode}")
    dt = time.perf_counter() - t0
    if ids_out:
        with open(ids_out, "w") as f:
            for e in encs:
                f.write(json.dumps(e.ids) + "\n")
    print(json.dumps({"encode_s": dt}))


def run_tokenizers(mode, threads, tokenizer_path, texts_path, ids_out=None):
    env = dict(os.environ)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    else:
        env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    cmd = [sys.executable, __file__, "--worker", mode, str(tokenizer_path), str(texts_path), ids_out or ""]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["encode_s"]


def run_tandem(tool, tokenizer_path, texts_path, out_path):
    t0 = time.perf_counter()
    proc = subprocess.run([tool, str(tokenizer_path), str(texts_path), str(out_path)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"tokenize_tool failed: {proc.stderr}")
    # "encoded BYTES bytes in SECONDS s"
    words = proc.stderr.strip().splitlines()[-1].split()
    return float(words[4]), int(words[1]), wall


# ----------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=24000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tool", default=str(REPO / "build" / "tests" / "tools" / "tokenize_tool"))
    ap.add_argument("--workdir", help="keep files here (default: a temporary directory)")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tandem-data-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    # Dataset -> template -> texts (the half file is for the tool's marginal wall time).
    rows = make_dataset(args.samples)
    (work / "alpaca.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    texts = [render_qwen3_nothink(r) for r in rows]
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    half = len(texts) // 2
    for name, part in (("texts.jsonl", texts), ("texts_half.jsonl", texts[:half])):
        with open(work / name, "w", encoding="utf-8") as f:
            for t in part:
                f.write(json.dumps(t, ensure_ascii=False) + "\n")
    half_bytes = sum(len(t.encode("utf-8")) for t in texts[:half])

    # Tokenizers.
    from tokenizer_fixtures import write_family
    toks = {"demo": REPO / "resources" / "demo" / "tokenizer.json",
            "qwen2_32k": write_family("qwen2", work / "fixtures", vocab_size=32000) / "tokenizer.json"}

    nproc = os.cpu_count()
    baselines = [("encode_loop", 1), ("encode_batch", 1), ("encode_batch", None), ("encode_batch_fast", None)]

    def label(mode, threads):
        return f"{mode}_{'1thread' if threads == 1 else f'{nproc}threads'}"

    load_before = os.getloadavg()[0]
    results = {}
    for tname, tpath in toks.items():
        vocab = json.loads(Path(tpath).read_text(encoding="utf-8"))["model"]
        times = {"tandem": [], "tandem_wall_marginal": []}
        times.update({label(m, t): [] for m, t in baselines})
        for rep in range(args.repeats):
            # Interleaved: tandem, each baseline, in the same order every repeat.
            enc_s, enc_bytes, wall_full = run_tandem(args.tool, tpath, work / "texts.jsonl", work / f"tandem_{tname}.jsonl")
            _, _, wall_half = run_tandem(args.tool, tpath, work / "texts_half.jsonl", work / "tandem_half.jsonl")
            assert enc_bytes == total_bytes, (enc_bytes, total_bytes)
            times["tandem"].append(enc_s)
            times["tandem_wall_marginal"].append(wall_full - wall_half)
            for m, t in baselines:
                ids_out = str(work / f"hf_{tname}.jsonl") if rep == 0 and m == "encode_loop" else None
                times[label(m, t)].append(run_tokenizers(m, t, tpath, work / "texts.jsonl", ids_out))

        # Same ids?
        mismatches = 0
        with open(work / f"tandem_{tname}.jsonl") as a, open(work / f"hf_{tname}.jsonl") as b:
            for la, lb in zip(a, b):
                if json.loads(la).get("ids") != json.loads(lb):
                    mismatches += 1
        n_tokens = sum(len(json.loads(l)) for l in open(work / f"hf_{tname}.jsonl"))

        def tput(seconds, n=len(texts), nbytes=total_bytes):
            return {"seconds": round(seconds, 4), "samples_per_s": round(n / seconds, 1),
                    "MB_per_s": round(nbytes / seconds / 1e6, 3)}

        med = {k: statistics.median(v) for k, v in times.items()}
        entry = {
            "vocab_size": len(vocab["vocab"]), "merges": len(vocab["merges"]),
            "tokens": n_tokens, "id_mismatches": mismatches,
            "tandem_1thread": tput(med["tandem"]),
            "tandem_1thread_tool_wall_marginal": tput(med["tandem_wall_marginal"], len(texts) - half,
                                                      total_bytes - half_bytes),
        }
        for m, t in baselines:
            entry[f"tokenizers_{label(m, t)}"] = tput(med[label(m, t)])
        entry["ratio_tandem_over_tokenizers"] = {
            label(m, t): round(med[label(m, t)] / med["tandem"], 3) for m, t in baselines}
        entry["all_runs_s"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
        results[tname] = entry

    print(json.dumps({
        "benchmark": "data_pipeline_tokenize",
        "samples": len(texts), "bytes": total_bytes,
        "mean_bytes_per_sample": round(total_bytes / len(texts), 1),
        "template": "qwen3_nothink", "repeats": args.repeats, "nproc": nproc,
        "tandem_threads": 1,
        "tokenizers_threads": {"encode_loop": 1, "encode_batch": [1, nproc], "encode_batch_fast": nproc},
        "tokenizers_version": __import__("tokenizers").__version__,
        "loadavg_1min_before_after": [load_before, os.getloadavg()[0]],
        "results": results,
    }, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
