#!/usr/bin/env bash
# On a two-GPU H200 machine (the `run` tool, kind nvidia-h200-x2): build tandem + tandem_e2e_bench,
# run the end-to-end benchmark (V2-Lite shape, all 27 layers; Qwen3-30B-A3B shape, $1 layers),
# then model parity with layers split over cuda:0 + cuda:1 and experts in offload mode.
#   Layout it expects (HELPERS.md): this tree copied to /work/main/.dev/gpu, the parity cases made
#   on the dev box (transformers 5.17 + peft 0.18.1; that machine has peft 0.21) in
#   .dev/gpu/.h200/cases (copy /work/main/.h200/cases), the .debs in /work/main/.debs; then
#   run: command "cd .dev/gpu && bash bench/e2e_train_bench_h200.sh 16", carry [".dev/gpu", ".debs"].
# Results go to $OUT: bench_<model>.json/.log, parity_placement.txt, parity_failures.txt.
# Parity outputs are compared in one python process (importing torch + transformers per case
# costs seconds each).
set -u
QWEN_LAYERS=${1:-16}
prefix=/tmp/prefix; mkdir -p $prefix
for f in ../../.debs/*.deb; do dpkg -x $f $prefix; done
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nproc; free -g | head -2; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
SECONDS=0
cmake -S . -B /tmp/b -G Ninja -DTANDEM_WITH_UI=OFF -DTANDEM_PYTHON=$(which python3) \
  -DCMAKE_PREFIX_PATH=$prefix/usr -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_BUILD_TYPE=Release > $OUT/cmake.log 2>&1 || { tail -40 $OUT/cmake.log; exit 1; }
ninja -C /tmp/b -j$(nproc) tandem tandem_e2e_bench > $OUT/build.log 2>&1 || { grep -B2 -A12 "error" $OUT/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
bench() {  # model, layers, timeout
  timeout $3 python3 bench/e2e_train_bench.py --bench /tmp/b/bin/tandem_e2e_bench --models $1 --layers $2 \
     --out $OUT/bench_$1.json > $OUT/bench_$1.log 2>&1; echo "bench $1 rc=$? ${SECONDS}s"
  python3 - $OUT/bench_$1.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m, r in d.items():
    for k in ("tandem_co", "tandem_offload", "hf_peft"):
        x = r.get(k, {})
        print(m, k, x.get("error", "")[:300] or f"{x.get('tokens_per_s', 0):.0f} tok/s peak {x.get('peak_gpu_gib', 0):.2f} GiB build {x.get('build_s', 0):.0f}s steps {[round(s['step_s'], 2) for s in x.get('steps', [])]}")
    print(m, "co/offload", r.get("co_over_offload_tokens_per_s"), "co mem/hf", r.get("co_gpu_memory_over_hf"))
    print(m, "overlap", r.get("tandem_co", {}).get("overlap_probe"))
PY
}
bench v2-lite 0 200
bench qwen3-30b-a3b $QWEN_LAYERS 170
cd tests/parity
: > /tmp/runs.txt
run_case() {  # case dir, dtype, label, extra flags...
  local c=$1 dt=$2 label=$3; shift 3
  local out=/tmp/out_$(basename $c)_$label.safetensors
  /tmp/b/bin/tandem debug grad --model $c/model --adapter $c/adapter --tokens $c/tokens.json --labels $c/labels.json \
     --out $out --dtype $dt "$@" 2> /tmp/err.txt && echo "$c $out $label" >> /tmp/runs.txt || echo "$(basename $c) $label FAILED: $(tail -3 /tmp/err.txt)"
}
for c in ../../.h200/cases/*; do
  dt=$(grep -o '"dtype": *"[a-z0-9]*"' $c/meta.json | grep -o '[a-z0-9]*"$' | tr -d '"')
  run_case $c $dt split-cuda0-cuda1 --device cuda:0 --layer-devices cuda:0:0,cuda:1:1-2
  case $(basename $c) in *qwen3_moe|*deepseek_v2|*deepseek_v3|*mixtral|*qwen2_moe)
    run_case $c $dt offload-cuda0 --device cuda:0 --experts gpu-offload
    run_case $c $dt offload-split --device cuda:0 --layer-devices cuda:0:0-1,cuda:1:2 --experts gpu-offload --gradient-checkpointing;;
  esac
done 2>&1 | tee $OUT/parity_failures.txt
echo "parity runs ${SECONDS}s"
python3 - <<'PY' 2>&1 | grep -v Warn | tee $OUT/parity_placement.txt
import os, reference as R
for line in open("/tmp/runs.txt"):
    c, out, label = line.split()
    r = R.compare_case(c, out); e = r["errors"]
    print(os.path.basename(c), label, "OK" if r["ok"] else "FAIL", r["failures"][:2], {k: float("%.3g" % v) for k, v in e.items()})
PY
echo "parity ${SECONDS}s"
