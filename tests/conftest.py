"""Fixtures shared by the suites that run `tandem` as a user does."""
import os
import re
import subprocess

import pytest


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Runs the built-in demo once per module: `tandem demo` makes the model and fine-tunes it.

    home: TANDEM_HOME of that run (its runs.db); model, adapter: the model and the LoRA it trained;
    stdout: what the demo printed; base, tuned: its two answers to "Who are you?"."""
    home = tmp_path_factory.mktemp("home")
    work = home / "demo"
    env = dict(os.environ, TANDEM_HOME=str(home))
    result = subprocess.run([os.environ["TANDEM_BIN"], "demo", "--workdir", str(work)], capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    answers = re.search(r"\n  base model:   (.*)\n  with adapter: (.*)\n\nchat with it", result.stdout, re.S)
    assert answers, result.stdout
    return {"home": home, "model": work / "model", "adapter": work / "output", "stdout": result.stdout,
            "base": answers.group(1), "tuned": answers.group(2)}
