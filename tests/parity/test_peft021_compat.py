"""PEFT 0.21 reads fused-expert LoRA in the other orientation than 0.18-0.20 (the pinned reference):
Tandem must read adapters saved by either and write either. This runs PEFT 0.21 (installed by
scripts/setup.sh under <venv>/compat/peft) in a subprocess, since one venv holds one peft."""

import json
import os
import subprocess
import sys
from pathlib import Path

TANDEM = os.environ["TANDEM_BIN"]
COMPAT = Path(sys.prefix) / "compat" / "peft"
HERE = Path(__file__).resolve().parent

SCRIPT = r'''
import json, subprocess, sys, torch
sys.path.insert(0, HERE)
import peft, reference as R
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
assert peft.__version__.startswith("0.21"), peft.__version__
model_dir = R.make_tiny_model("qwen3_moe", ROOT + "/model", seed=0)
model = R._load_model(model_dir, "fp32")
config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.0,
                    target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
peft_model = get_peft_model(model, config)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
peft_model.save_pretrained(ROOT + "/adapter")
ids = [[5, 7, 9, 11, 13, 2, 4, 6, 8, 10]]
json.dump(ids, open(ROOT + "/tokens.json", "w"))
def tandem_logits(adapter):
    out = adapter + "/out.safetensors"
    r = subprocess.run([TANDEM, "debug", "forward", "--model", model_dir, "--adapter", adapter,
                        "--tokens", ROOT + "/tokens.json", "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return load_file(out)["logits"]
def rel(a, b):
    return ((a - b).norm() / b.norm()).item()
with torch.no_grad():
    reference = peft_model(torch.tensor(ids)).logits
result = {"read_021": rel(tandem_logits(ROOT + "/adapter"), reference)}
for fmt in ["fused-peft0.21", "per-expert"]:
    r = subprocess.run([TANDEM, "debug", "export-adapter", "--model", model_dir, "--adapter", ROOT + "/adapter",
                        "--out", ROOT + "/" + fmt, "--format", fmt], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    result["tandem_" + fmt] = rel(tandem_logits(ROOT + "/" + fmt), reference)
reloaded = PeftModel.from_pretrained(R._load_model(model_dir, "fp32"), ROOT + "/fused-peft0.21")
with torch.no_grad():
    result["peft021_loads_export"] = rel(reloaded(torch.tensor(ids)).logits, reference)
print(json.dumps(result))
'''


def test_peft_021_fused_layout_reads_and_writes(tmp_path):
    assert COMPAT.exists(), f"{COMPAT} is missing: run scripts/setup.sh (it installs the compat pins)"
    code = SCRIPT.replace("HERE", repr(str(HERE))).replace("ROOT", repr(str(tmp_path))).replace("TANDEM", repr(TANDEM))
    env = dict(os.environ, PYTHONPATH=str(COMPAT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for what, error in errors.items():
        assert error < 1e-5, (what, error)
