"""LLaMA-Factory's predict_with_generate metrics, computed by the reference packages themselves
(jieba, rouge-chinese, nltk; versions pinned in scripts/python-requirements.txt), the way
src/llamafactory/train/sft/metric.py ComputeSimilarity does, plus Tandem's BLEU-1..3 (the same
sentence_bleu call with uniform weights) and the multiple-choice rule of docs/eval.md."""
import logging
import re

import jieba
import numpy as np
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_chinese import Rouge

jieba.setLogLevel(logging.CRITICAL)
jieba.initialize()

BLEU_WEIGHTS = {1: (1.0,), 2: (1 / 2, 1 / 2), 3: (1 / 3, 1 / 3, 1 / 3), 4: (0.25, 0.25, 0.25, 0.25)}


def similarity(pred, label):
    """One sample, as ComputeSimilarity: rouge-1/2/l and bleu-1..4, x100, round(., 4)."""
    hypothesis = list(jieba.cut(pred))
    reference = list(jieba.cut(label))
    if len(" ".join(hypothesis).split()) == 0 or len(" ".join(reference).split()) == 0:
        result = {"rouge-1": {"f": 0.0}, "rouge-2": {"f": 0.0}, "rouge-l": {"f": 0.0}}
    else:
        result = Rouge().get_scores(" ".join(hypothesis), " ".join(reference))[0]
    scores = {k: round(v["f"] * 100, 4) for k, v in result.items()}
    for n, weights in BLEU_WEIGHTS.items():
        bleu = sentence_bleu([list(label)], list(pred), weights=weights,
                             smoothing_function=SmoothingFunction().method3)
        scores[f"bleu-{n}"] = round(bleu * 100, 4)
    return scores


def choice(text, letters):
    """docs/eval.md: the whole text, else a leading letter, else the last standalone letter."""
    text = text.strip(" \t\n\r\f\v")
    if not text:
        return None
    if text[0] in letters and (len(text) == 1 or not re.match(r"[A-Za-z0-9]", text[1])):
        return text[0]
    for i in range(len(text) - 1, -1, -1):
        if text[i] in letters:
            left = i == 0 or not re.match(r"[A-Za-z0-9]", text[i - 1])
            right = i + 1 == len(text) or not re.match(r"[A-Za-z0-9]", text[i + 1])
            if left and right:
                return text[i]
    return None


def dataset_results(rows, letters=None):
    """predict_results.json's scores: np.mean of the per-sample scores, as LLaMA-Factory."""
    per_sample = [similarity(r["predict"], r["label"]) for r in rows]
    results = {"predict_samples": len(rows)}
    if rows:
        for key in per_sample[0]:
            results[f"predict_{key}"] = float(np.mean([s[key] for s in per_sample]))
    if letters:
        correct = []
        for r in rows:
            label = choice(r["label"], letters)
            if label is not None:
                correct.append(1.0 if choice(r["predict"], letters) == label else 0.0)
        if correct:
            results["predict_accuracy"] = float(100.0 * np.mean(correct))
            results["predict_choice_samples"] = len(correct)
    return per_sample, results
