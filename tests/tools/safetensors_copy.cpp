// safetensors_copy IN OUT: copies every tensor of a .safetensors file or model directory (single
// file or index + shards) into one new .safetensors file, through zero-copy views. Metadata of a
// single input file is kept; for shards, that of the first shard opened (they normally agree).
// Exit status: 0 on success, 1 on a tandem::Error (printed), 2 on bad usage.

#include <cstdio>
#include <exception>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s INPUT(.safetensors file or model dir) OUTPUT.safetensors\n",
                 argv[0]);
    return 2;
  }
  try {
    const tandem::io::SafetensorsModel model = tandem::io::SafetensorsModel::open(argv[1]);
    std::vector<tandem::io::TensorToWrite> tensors;
    for (const std::string& name : model.names()) {
      const tandem::io::TensorView view = model.view(name);
      tensors.push_back({name, view.info->dtype, view.info->shape, view.bytes});
    }
    const auto& files = model.files();
    const std::map<std::string, std::string> metadata =
        files.empty() ? std::map<std::string, std::string>{} : files.front()->header().metadata;
    tandem::io::writeSafetensors(argv[2], tensors, metadata);
    std::printf("copied %zu tensors from %zu file(s) to %s\n", tensors.size(), files.size(),
                argv[2]);
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
