#!/usr/bin/env python3
"""Regenerates the jieba tables Tandem's C++ segmenter reads (engine/eval/jieba_segmenter.h)
from the installed PyPI `jieba` package (pinned in scripts/python-requirements.txt).

    python resources/jieba/generate.py            # writes dict.txt.gz and hmm.txt.gz here

dict.txt.gz: jieba/dict.txt, keeping the two fields jieba's gen_pfdict reads ("word freq"), in
             file order (order matters: a repeated word counts twice in the total, last wins).
hmm.txt.gz:  the finalseg HMM as tab-separated lines, floats in repr() so they parse back exactly:
               start<TAB>state<TAB>logp
               trans<TAB>from<TAB>to<TAB>logp
               emit<TAB>state<TAB>char<TAB>logp
Both are gzip files with mtime 0, so the same jieba version gives byte-identical files.
"""
import gzip
import io
import os
import sys

import jieba
from jieba.finalseg.prob_emit import P as emit_p
from jieba.finalseg.prob_start import P as start_p
from jieba.finalseg.prob_trans import P as trans_p


def write_gz(path, text):
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write(text.encode("utf-8"))
    with open(path, "wb") as out:
        out.write(buffer.getvalue())


def dict_text():
    lines = []
    with open(os.path.join(os.path.dirname(jieba.__file__), "dict.txt"), "rb") as f:
        for line in f:
            word, freq = line.strip().decode("utf-8").split(" ")[:2]
            lines.append(f"{word} {int(freq)}\n")
    return "".join(lines)


def hmm_text():
    lines = [f"start\t{s}\t{p!r}\n" for s, p in start_p.items()]
    lines += [f"trans\t{a}\t{b}\t{p!r}\n" for a, row in trans_p.items() for b, p in row.items()]
    for state, row in emit_p.items():
        for char, p in row.items():
            if len(char) != 1 or char in "\t\n":
                sys.exit(f"unexpected emission key {char!r}")
            lines.append(f"emit\t{state}\t{char}\t{p!r}\n")
    return "".join(lines)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    write_gz(os.path.join(here, "dict.txt.gz"), dict_text())
    write_gz(os.path.join(here, "hmm.txt.gz"), hmm_text())
    print(f"jieba {jieba.__version__}: wrote dict.txt.gz and hmm.txt.gz in {here}")


if __name__ == "__main__":
    main()
