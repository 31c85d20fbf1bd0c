"""`tandem eval --predictions` scores a fixed set of predictions exactly as LLaMA-Factory's reference
packages do (jieba + rouge-chinese + nltk, np.mean), and Tandem's C++ jieba cuts a few hundred
varied sentences exactly as python jieba does."""
import json
import os
import random
import subprocess
from pathlib import Path

import jieba
import pytest

from llamafactory_reference import dataset_results

TANDEM = os.environ["TANDEM_BIN"]

LONG_ZH = ("人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"
           "该领域的研究包括机器人、语言识别、图像识别、自然语言处理和专家系统等！人工智能从诞生以来，理论和技术日益成熟？")
LONG_EN = ("Large language models are trained on vast corpora. They predict the next token, one at a time; "
           "fine-tuning with LoRA adapts a few low-rank matrices while the base weights stay frozen. ") * 3

# (predict, label): English, Chinese, mixed, empty, white space only, punctuation, repeated words,
# sentence ends that rouge_chinese splits on, unknown words (jieba's HMM), multiple choice.
CASES = [
    ("the cat sat on the mat", "the cat is on the mat"),
    ("I am Tandem, an AI assistant.", "I am Tandem, an AI assistant made by the Tandem team."),
    ("Hello", "Goodbye"),
    ("the the the the the the the", "the cat is on the mat"),
    ("the cat the cat the cat the cat", "the cat"),
    ("我爱北京天安门", "我爱北京"),
    ("今天天气很好。我们去公园吧！", "今天天气不错，我们去公园玩吧。"),
    ("他来到了网易杭研大厦", "他来到网易杭研大厦工作"),
    ("小明硕士毕业于中国科学院计算所，后在日本京都大学深造", "小明毕业于中科院计算所，后来去了日本京都大学"),
    ("永和服装饰品有限公司", "永和服装饰品公司"),
    ("我用Python写了3.14%的代码，version 2.0很好用", "我用 Python 写代码，版本2.0很好用"),
    ("", ""),
    ("", "有内容的标签"),
    ("有内容的预测", ""),
    ("   ", "a"),
    ("\n\t\r\n", "\u3000"),
    ("！！！？？？。。。", "。。。"),
    ("他说：“你好。”然后走了。", "他说：“你好！”然后离开了。"),
    ("等等......然后呢？", "等等……然后……呢"),
    ("真的吗？？好的！", "真的吗?好的."),
    ("Wait... what?! No.", "Wait. What? No!"),
    ("数字：2024年11月30日，温度-3.5度", "2024年11月30日 温度 -3.5 度"),
    ("emoji 😀 也可以 🎉", "emoji 😀 可以"),
    ("日本語のテキストも混ざる", "日本語のテキスト"),
    ("한국어 문장도 있습니다", "한국어 문장"),
    ("tab\tseparated\twords", "tab separated words"),
    ("a b c d e f g", "g f e d c b a"),
    ("重复重复重复重复", "重复"),
    (LONG_ZH, LONG_ZH[10:120] + "。" + LONG_ZH[:40]),
    (LONG_EN, LONG_EN[50:300]),
    ("A", "A"),
    ("B", "A"),
    ("The answer is C.", "C"),
    ("答案：D", "D"),
    ("a", "A"),
    ("Absolutely B) because", "B"),
    ("(C)", "D"),
]


def run(*args, **kw):
    return subprocess.run([TANDEM, *args], capture_output=True, text=True, timeout=300, **kw)


def write_predictions(path, cases):
    with open(path, "w", encoding="utf-8") as f:
        for predict, label in cases:
            f.write(json.dumps({"prompt": "q", "predict": predict, "label": label}, ensure_ascii=False) + "\n")


def score_with_tandem(tmp_path, cases, *extra):
    predictions = tmp_path / "generated_predictions.jsonl"
    write_predictions(predictions, cases)
    out = tmp_path / "scored"
    result = run("eval", "--predictions", str(predictions), "--output-dir", str(out), "--no-store", *extra)
    assert result.returncode == 0, result.stderr
    per_sample = [json.loads(line) for line in (out / "sample_scores.jsonl").read_text().splitlines()]
    return per_sample, json.loads((out / "predict_results.json").read_text()), result


def test_fixed_predictions_equal_the_reference_exactly(tmp_path):
    ours_samples, ours, _ = score_with_tandem(tmp_path, CASES, "--choices", "ABCD")
    rows = [{"predict": p, "label": label} for p, label in CASES]
    ref_samples, ref = dataset_results(rows, "ABCD")
    assert len(ours_samples) == len(CASES)
    for i, (mine, theirs) in enumerate(zip(ours_samples, ref_samples)):
        for key, value in theirs.items():
            assert mine[key] == value, f"sample {i} {CASES[i]!r}: {key} tandem {mine[key]!r} reference {value!r}"
    for key, value in ref.items():
        assert ours[key] == value, f"{key}: tandem {ours[key]!r} reference {value!r}"
    # The LLaMA-Factory keys are all there, and the set was not degenerate.
    for key in ("predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l"):
        assert 0 < ours[key] < 100
    assert ours["predict_choice_samples"] == 7 and 0 < ours["predict_accuracy"] < 100


def test_many_samples_average_like_numpy(tmp_path):
    # More than 128 samples: np.mean's pairwise summation splits the array; the means must still
    # be the same floats.
    rng = random.Random(7)
    words = ["模型", "训练", "数据", "the", "model", "learns", "很", "好", "。", " ", "快速", "answer"]
    cases = [("".join(rng.choice(words) for _ in range(rng.randint(0, 12))),
              "".join(rng.choice(words) for _ in range(rng.randint(1, 12)))) for _ in range(300)]
    _, ours, _ = score_with_tandem(tmp_path, cases)
    _, ref = dataset_results([{"predict": p, "label": label} for p, label in cases])
    for key, value in ref.items():
        assert ours[key] == value, f"{key}: tandem {ours[key]!r} reference {value!r}"


def test_bad_rows_are_counted_and_reported(tmp_path):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text('{"predict": "a", "label": "a"}\nnot json\n{"predict": 1, "label": "x"}\n'
                           '{"predict": "b", "label": "b"}\n', encoding="utf-8")
    result = run("eval", "--predictions", str(predictions), "--output-dir", str(tmp_path / "o"), "--no-store")
    assert result.returncode == 0, result.stderr
    assert "2 bad rows" in result.stderr and "line 2" in result.stderr
    scores = json.loads((tmp_path / "o" / "predict_results.json").read_text())
    assert scores["predict_samples"] == 2 and scores["predict_bad_rows"] == 2
    assert scores["predict_rouge-1"] == 100.0


def test_missing_or_empty_predictions_are_clear_errors(tmp_path):
    result = run("eval", "--predictions", str(tmp_path / "missing.jsonl"), "--no-store")
    assert result.returncode == 1 and "cannot read the predictions file" in result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json at all\n")
    result = run("eval", "--predictions", str(empty), "--output-dir", str(tmp_path / "o"), "--no-store")
    assert result.returncode == 1 and "no usable prediction" in result.stderr


# ---- jieba segmentation ------------------------------------------------------------------------

NATURAL = [
    "我来到北京清华大学", "他来到了网易杭研大厦", "小明硕士毕业于中国科学院计算所，后在日本京都大学深造",
    "工信处女干事每月经过下属科室都要亲口交代24口交换机等技术性器件的安装工作", "结婚的和尚未结婚的",
    "这个把手该换了，我不喜欢日本和服，别把手放在我的肩膀上", "江州市长江大桥参加了长江大桥的通车仪式",
    "我们中出了一个叛徒", "吴国忠臣伍子胥", "李小福是创新办主任也是云计算方面的专家", "什么是八一双鹿",
    "例如我输入一个带“韩玉赏鉴”的标题，在自定义词库中也增加了此词为N类", "「台中」正確應該不會被切開。mac上可分出「石墨烯」；此時又可以分出來凱特琳了。",
    "Python是一种计算机程序设计语言，版本3.12发布于2023年10月2日。", "GPU显存不够时，可以把MoE的专家放到CPU内存里计算",
    "欢迎使用Tandem：在一台工作站上微调超大的混合专家模型！", "今天的气温是-3.5℃，湿度45%，风力3级。",
    "他说：“我明天再来。”她问：“真的吗？”", "等等……你说什么？！", "1.5.3版本修复了#1234号问题&提升了速度_50%",
    "   前后都有空格   ", "换行\n之后\r\n再换行", "全角　空格　分隔", "tab\t分隔\t的文本", "",
    "ＡＢＣ全角字母和１２３全角数字", "emoji😀混在中文里🎉也没问题", "日本語の文章と中文混合", "한국어와 중문 혼합",
    "南京市长江大桥", "研究生命的起源", "乒乓球拍卖完了", "发展中国家兔", "馆内陈列周恩来和邓颖超生前使用过的物品",
    "王小二和张三丰在武当山下比武", "阿里巴巴集团的马云和腾讯的马化腾都参加了会议", "北京大学生前来应聘",
    "大数据、云计算、人工智能和区块链是新基建的重点", "我爱自然语言处理", "这是一个非常非常非常长的句子" * 5,
]


def generated_sentences(count, seed=20261130):
    """Random but reproducible text: dictionary words, characters the dictionary may lack (so
    jieba's HMM runs), ASCII words and numbers, punctuation and white space."""
    rng = random.Random(seed)
    with open(os.path.join(os.path.dirname(jieba.__file__), "dict.txt"), encoding="utf-8") as f:
        words = [line.split(" ")[0] for line in f]
    pieces = [
        lambda: rng.choice(words),
        lambda: rng.choice(words) + rng.choice(words),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FD5)) for _ in range(rng.randint(1, 4))),
        lambda: rng.choice(["GPU", "LoRA", "v2", "3.14", "100%", "C++", "a_b", "x-y", "R&D", "#1"]),
        lambda: rng.choice(["，", "。", "！", "？", "、", "；", "：", "“", "”", "（", "）", " ", "\n", "\t", "\r\n", ",", "."]),
    ]
    weights = [5, 2, 2, 1, 2]
    return ["".join(rng.choices(pieces, weights)[0]() for _ in range(rng.randint(1, 20))) for _ in range(count)]


def test_jieba_cut_equals_python_jieba(tmp_path):
    corpus = NATURAL + generated_sentences(400)
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in corpus), encoding="utf-8")
    result = run("debug", "jieba", str(source))
    assert result.returncode == 0, result.stderr
    ours = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(ours) == len(corpus)
    mismatches = [(s, cut, list(jieba.cut(s))) for s, cut in zip(corpus, ours) if cut != list(jieba.cut(s))]
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} differ, first: {mismatches[0]!r}"
    # The corpus did exercise the HMM: many Chinese words it found are not in the dictionary.
    unknown = {w for cut in ours for w in cut
               if len(w) > 1 and all("\u4e00" <= c <= "\u9fd5" for c in w) and not jieba.dt.FREQ.get(w)}
    assert len(unknown) > 30, sorted(unknown)


@pytest.mark.parametrize("content", ['"ok"\nnot json\n', '["a list"]\n'])
def test_jieba_debug_rejects_bad_lines(tmp_path, content):
    source = tmp_path / "bad.jsonl"
    source.write_text(content)
    result = run("debug", "jieba", str(source))
    assert result.returncode == 1 and "line" in result.stderr
