#pragma once
// Issue 29: the bench's host memory per phase (after the build, after a length's first forward,
// after its first step), to see what grows with the sequence on the host. Linux's
// /proc/self/status in bytes: resident now (VmRSS) and its peak so far (VmHWM), split into
// anonymous (RssAnon: heap, libtorch's CPU tensors), file-backed (RssFile: mapped checkpoints,
// libraries) and shared (RssShmem); VmPin and VmLck: pinned / locked pages where the driver
// reports them (CUDA's pinned host memory is part of the resident figures either way). Empty on
// another system.

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace tandem::bench {

inline nlohmann::json hostRssJson() {
  nlohmann::json out = nlohmann::json::object();
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream fields(line);
    std::string key;
    long long kib = 0;
    fields >> key >> kib;
    if (key.empty() || key.back() != ':') continue;
    key.pop_back();
    for (const char* wanted :
         {"VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmPin", "VmLck"}) {
      if (key == wanted) out[key + "_bytes"] = kib * 1024;
    }
  }
  return out;
}

}  // namespace tandem::bench
