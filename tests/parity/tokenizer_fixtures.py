"""Deterministic tokenizers and test strings for Tandem's tokenizer parity tests.

No model hub is reachable, so each target family's tokenizer is rebuilt here with the PyPI
`tokenizers` package: the real family's normalizer / pre-tokenizer / post-processor / decoder
structure (as published in its tokenizer.json) around a BPE model trained on generated
multilingual text. Everything is seeded, so the same files come out on every run.

    python tests/parity/tokenizer_fixtures.py OUT_DIR   # writes OUT_DIR/<family>/tokenizer.json
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

# The split regexes of the published tokenizer.json files.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_V3_PATTERNS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# ---------------------------------------------------------------------------- text generation

WORDS = {
    "en": "the of and to in is you that it he was for on are as with his they at be this have from "
          "or one had by word but not what all were we when your can said there use an each which she "
          "do how their if will up other about out many then them these so some her would make like "
          "him into time has look two more write go see number no way could people my than first water "
          "been call who oil its now find long down day did get come made may part Hello World OpenAI "
          "Tandem LoRA mixture experts GPU CPU tokenizer McDonald's iPhone naïve café résumé".split(),
    "zh": "我们 你好 世界 中国 人工智能 机器学习 深度 模型 训练 数据 的 是 了 在 和 有 这个 那个 学习 "
          "语言 计算机 程序 北京 上海 天气 今天 明天 非常 喜欢 龥 丽 亂".split(),
    "ja": "こんにちは 世界 ありがとう ございます 日本語 カタカナ ひらがな 東京 トークナイザー です ます "
          "した ラーメン コンピュータ ｶﾀｶﾅ ゔ ヴ".split(),
    "ko": "안녕하세요 세계 한국어 감사합니다 컴퓨터 모델 학습 데이터 서울 사랑 가".split(),
    "ar": "مرحبا بالعالم اللغة العربية شكرا كتاب مدرسة الذكاء الاصطناعي".split(),
    "ru": "привет мир русский язык спасибо модель обучение данные Москва ЁЛКА ёлка".split(),
    "el": "γειά σου κόσμε ελληνικά Αθήνα ΣΟΦΙΑ".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा धन्यवाद".split(),
    "th": "สวัสดี ชาวโลก ภาษาไทย ขอบคุณ".split(),
    "he": "שלום עולם עברית תודה".split(),
    "vi": "Tiếng Việt xin chào thế giới cảm ơn người".split(),
    "de": "Grüße Straße Mädchen über Übermut ÄÖÜ ß ẞ".split(),
}
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏻", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "❤️", "🇯🇵", "🇺🇸",
         "🧑🏿‍🤝‍🧑🏻", "👁️‍🗨️", "✈️", "🤖", "🫠", "🦀", "🐍", "1️⃣", "#️⃣", "©️", "™"]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "#include <vector>\nstd::vector<int32_t> ids{1, 2, 3};\r\n",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "x=[i*i for i in range(10)]\nprint(f'{x!r:>10}')",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"hi\"); Ok(()) }",
    "<div class=\"a\">&nbsp;&lt;tag&gt;</div>",
    "    \n\n    indented\n\t\ttabs\t\tand   spaces   \n",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
]
CONTRACTIONS = ["don't", "I'M", "it's", "They'LL", "we've", "you'd", "she'S", "O'Neil", "rock'n'roll",
                "’s", "isn’t", "'t", "''s", "'RE", "aren'T"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2003", "\u180e",
          "\u0085", "\u2028", "\u200b", "\ufeff", "\u202f", " \t \n"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "A\u030a", "\u1100\u1161\u11a8",
             "Z\u0335\u0321\u0334", "q\u0307\u0323", "\u0915\u094d\u0937", "\u05d1\u05bc\u05b8",
             "i\u0307\u0301", "\u0041\u0301\u0302\u0303", "\u0300", "\u0345\u0301", "\u2126", "\u212b",
             "\u0f73", "\u0344", "\uac00\u11a8", "\u1e9b\u0323", "a\u1ac1", "\u0d4a", "\u0b4b"]
BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x36F), (0x370, 0x52F), (0x530, 0x8FF), (0x900, 0xDFF),
          (0xE00, 0x1000), (0x1000, 0x1FFF), (0x2000, 0x2BFF), (0x2E80, 0x2FFF), (0x3000, 0x30FF),
          (0x3100, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xABFF), (0xAC00, 0xD7FF), (0xE000, 0xE0FF),
          (0xF900, 0xFFFD), (0x10000, 0x1047F), (0x11000, 0x11FFF), (0x16800, 0x16FFF),
          (0x1D400, 0x1D7FF), (0x1F000, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F),
          (0xF0000, 0xF00FF)]


def random_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(BLOCKS)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp < 0xE000:
            cp = 0xE000
        out.append(chr(cp))
    return "".join(out)


def random_number(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}"
    if kind == 2:
        return f"{rng.randrange(10 ** 9):,}"
    if kind == 3:
        return rng.choice(["١٢٣٤", "१२३", "一二三", "½", "²³", "Ⅻ", "①②", "０１２３"])
    return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(1, 16)))


def random_piece(rng, specials):
    kind = rng.randrange(10)
    if kind == 0:
        lang = rng.choice(list(WORDS))
        sep = "" if lang in ("zh", "ja") and rng.random() < 0.5 else " "
        return sep.join(rng.choice(WORDS[lang]) for _ in range(rng.randint(1, 8)))
    if kind == 1:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 2:
        return rng.choice(CODE)
    if kind == 3:
        return random_number(rng)
    if kind == 4:
        return rng.choice(SPACES) * rng.randint(1, 4)
    if kind == 5:
        return rng.choice(CONTRACTIONS)
    if kind == 6:
        return rng.choice(specials) if specials else "<|x|>"
    if kind == 7:
        return random_unicode(rng, rng.randint(1, 12))
    if kind == 8:
        return "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))
    return rng.choice(WORDS["en"]).upper() + rng.choice([".", ",", "!", "?", "...", ":", ";", "—", "\"", ")"])


def test_strings(count, seed, specials=()):
    """`count` varied strings, deterministic for a seed; the first ones cover edge cases."""
    rng = random.Random(seed)
    fixed = ["", " ", "a", "\n", "   ", "\t\t", "Hello world", " Hello", "hello  world  ", "1234567890",
             "I'm here, you're there", "日本語のテキスト", "😀👍🏽👨‍👩‍👧‍👦", "e\u0301", "\u1100\u1161", "\r\n\r\n",
             "ab" * 300, "9" * 100, " " * 50 + "x", "x" + " " * 50]
    fixed += [s + t for s in specials for t in ("", "x", " x", "\n")] + [" " + s + " " for s in specials]
    out = list(fixed)
    while len(out) < count:
        pieces = [random_piece(rng, list(specials)) for _ in range(rng.randint(1, 6))]
        joiner = rng.choice(["", " ", "", "\n"])
        out.append(joiner.join(pieces))
    return out[:count]


def training_corpus(seed=1234, lines=6000):
    rng = random.Random(seed)
    return [" ".join(random_piece(rng, []) for _ in range(rng.randint(2, 12))) for _ in range(lines)]


# ---------------------------------------------------------------------------- tokenizers

def _split(pattern):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def _train(normalizer, pre_tokenizer, vocab_size, seed):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_corpus(seed), trainer=trainer)
    return tok


def _with_model_fields(tok, **fields):
    data = json.loads(tok.to_str())
    data["model"].update(fields)
    return data


def _string_merges(data):
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    return data


def build_qwen2(vocab_size=4000):
    """Qwen2/2.5/3: NFC + Split(Isolated) + ByteLevel(no regex); merges in the "a b" form."""
    tok = _train(normalizers.NFC(),
                 pre_tokenizers.Sequence([_split(QWEN2_PATTERN),
                                          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                 vocab_size, seed=2)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": None}
    return _string_merges(json.loads(tok.to_str())), config


def build_llama3(vocab_size=4000):
    """Llama-3: Split with \\p{N}{1,3} + ByteLevel; BPE ignore_merges; TemplateProcessing adds BOS."""
    tok = _train(None,
                 pre_tokenizers.Sequence([_split(LLAMA3_PATTERN),
                                          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                 vocab_size, seed=3)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(" <mask>", special=False, normalized=True, lstrip=True, rstrip=True),
                    AddedToken("word_only", special=False, normalized=False, single_word=True)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]),
    ])
    data = _with_model_fields(tok, ignore_merges=True)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|eot_id|>"}
    return data, config


def build_deepseek_v3(vocab_size=4000):
    """DeepSeek-V3: empty normalizer Sequence, three Splits (digits, CJK, words) + ByteLevel; BOS template."""
    tok = _train(normalizers.Sequence([]),
                 pre_tokenizers.Sequence([_split(p) for p in DEEPSEEK_V3_PATTERNS]
                                         + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                 vocab_size, seed=4)
    bos, eos, pad = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (bos, eos, pad)])
    tok.add_tokens([AddedToken("<｜User｜>", special=False, normalized=True),
                    AddedToken("<｜Assistant｜>", special=False, normalized=True)])
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    config = {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": False,
              "bos_token": {"content": bos, "lstrip": False}, "eos_token": {"content": eos}, "pad_token": pad}
    return json.loads(tok.to_str()), config


def build_byte_level_gpt2(vocab_size=1200):
    """GPT-2 style ByteLevel with its own regex and add_prefix_space (older models; extra coverage)."""
    tok = _train(None, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), vocab_size, seed=5)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return json.loads(tok.to_str()), {"eos_token": "<|endoftext|>"}


def build_llama2_sentencepiece(vocab_size=3000):
    """Llama-2 / Mixtral (SentencePiece converted): Prepend + Replace normalizer, no pre-tokenizer,
    BPE with byte_fallback and fuse_unk, the Replace/ByteFallback/Fuse/Strip decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=specials + byte_tokens,
                         limit_alphabet=400)
    tok.train_from_iterator(training_corpus(6), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    data = json.loads(tok.to_str())
    # As in the converted Llama-2 file: the <0xXX> pieces are plain vocab entries, not added tokens.
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in specials]
    config = {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": False,
              "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}
    return data, config


FAMILIES = {"qwen2": build_qwen2, "llama3": build_llama3, "deepseek_v3": build_deepseek_v3,
            "gpt2": build_byte_level_gpt2, "llama2": build_llama2_sentencepiece}


def special_strings(data):
    return [t["content"] for t in data.get("added_tokens", [])]


def write_family(name, out_dir, **kwargs):
    data, config = FAMILIES[name](**kwargs)
    out = Path(out_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return out


if __name__ == "__main__":
    for family in FAMILIES:
        print(write_family(family, sys.argv[1]))
