"""The CLI as a package ships it: bash completion made from the command tree, and the shipped files
found relative to the program (a copied install tree runs; a broken one says what to set)."""
import os
import re
import shutil
import subprocess

TANDEM = os.environ["TANDEM_BIN"]


def complete(script, words, cwd=None):
    """What bash offers for `words` (the last one is being typed) with tandem's completion loaded."""
    line = " ".join(words)
    program = (f'{script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n'
               '_tandem\nprintf "%s\\n" "${COMPREPLY[@]}"\n')
    r = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def subcommands_in_help(*path):
    out = subprocess.run([TANDEM, *path, "--help"], capture_output=True, text=True, timeout=60).stdout
    section = out.split("Subcommands:", 1)[1] if "Subcommands:" in out else ""
    return {m.group(1) for m in re.finditer(r"^  ([a-z][a-z0-9-]*)\s", section, re.M)}


def test_bash_completion_knows_every_subcommand_and_option(tmp_path):
    script = subprocess.run([TANDEM, "completion", "bash"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    top = subcommands_in_help()
    assert {"train", "chat", "demo", "info", "completion"} <= top
    assert complete(script, ["tandem", "''"]) == top
    assert complete(script, ["tandem", "tr"]) == {"train"}
    assert subcommands_in_help("debug") <= complete(script, ["tandem", "debug", "''"])
    train_options = complete(script, ["tandem", "train", "--"])
    assert "--help" in train_options
    help_text = subprocess.run([TANDEM, "train", "--help"], capture_output=True, text=True).stdout
    assert set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text)) <= train_options
    assert complete(script, ["tandem", "info", "--"]) >= {"--json", "--help"}
    # after an option that takes a value, files are offered; after a flag, subcommands or files
    (tmp_path / "my.yaml").write_text("")
    assert complete(script, ["tandem", "chat", "--model", "''"], cwd=tmp_path) == {"my.yaml"}


def test_a_copied_install_tree_finds_its_files(tmp_path):
    """bin/tandem finds ../share/tandem/presets wherever the tree is (as the tarball unpacks it)."""
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy(TANDEM, prefix / "bin" / "tandem")
    built = os.path.realpath(os.path.join(os.path.dirname(TANDEM), "..", "share", "tandem"))
    presets = prefix / "share" / "tandem" / "presets"
    shutil.copytree(os.path.join(built, "presets"), presets)
    shutil.copy(presets / "hardware" / "1x4090-24g_xeon-w7-spr_256g.yaml", presets / "hardware" / "only-here.yaml")
    config = tmp_path / "train.yaml"
    model = os.path.join(built, "presets", "models", "qwen3-30b-a3b.json")
    config.write_text(f"model_name_or_path: {model}\nstage: sft\n"
                      "do_train: true\nfinetuning_type: lora\nlora_target: all\ndataset: identity\n"
                      f"template: qwen3\ncutoff_len: 2048\nbf16: true\noutput_dir: {tmp_path / 'out'}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TANDEM_PRESETS", "TANDEM_RESOURCES")}

    def plan(**extra_env):
        return subprocess.run([str(prefix / "bin" / "tandem"), "plan", str(config), "--hardware", "only-here",
                               "--json"], capture_output=True, text=True, env=dict(env, **extra_env), timeout=120)

    r = plan()
    assert r.returncode == 0, r.stderr
    shutil.rmtree(presets)
    r = plan()
    assert r.returncode == 1
    assert "presets folder is missing" in r.stderr and "TANDEM_PRESETS" in r.stderr, r.stderr
    r = plan(TANDEM_PRESETS=os.path.join(built, "presets"))  # the override wins; that tree lacks the preset
    assert r.returncode == 1 and "no hardware preset named 'only-here'" in r.stderr, r.stderr
