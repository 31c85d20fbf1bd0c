#!/usr/bin/env bash
# The CUDA parts compile: the CPU build (CI, the tandem package) leaves them out, so this configures
# the same sources with TANDEM_WITH_CUDA=ON in a tree of its own and builds the libraries that hold
# them (engine/gpu's kernels, CUDA streams and allocator stats; engine/model's device probe), with
# warnings as errors. Nothing runs: the machine has nvcc and no GPU.
#   cuda_compile_check.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_PYTHON="$python" \
  -DTANDEM_WITH_CUDA=ON -DTANDEM_WITH_UI=OFF -DTANDEM_WITH_SERVER=OFF -DTANDEM_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
grep -q '^TANDEM_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "cuda_compile_check: the configuration did not turn CUDA on"; exit 1; }
# The translation units with CUDA code in them (grep TANDEM_WITH_CUDA): the rest compile the same
# in both builds.
objects=()
for f in engine/gpu/int8_kernels_cuda.cu engine/gpu/int4_kernels_cuda.cu engine/gpu/int4_dequant.cpp \
         engine/gpu/side_copy.cpp engine/gpu/row_scale.cpp \
         engine/gpu/checkpoint_offload.cpp \
         engine/gpu/int8_cast.cpp engine/gpu/torch_runtime.cpp engine/gpu/host_block.cpp; do
  objects+=("engine/gpu/CMakeFiles/tandem_gpu.dir/$(basename "$f").o")
done
objects+=(engine/model/CMakeFiles/tandem_model.dir/machine_probe.cpp.o)
objects+=(engine/model/CMakeFiles/tandem_model.dir/cost_calibration.cpp.o)
cmake --build "$build" --target "${objects[@]}" -- -j"$(nproc)"
