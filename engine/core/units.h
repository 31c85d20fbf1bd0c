#pragma once
// Human-readable sizes for people: bytes in binary units (GiB, as memory is sold and measured
// by tools like free and nvidia-smi), parameter counts in decimal (30.5 B, as models are named).

#include <cstdint>
#include <span>
#include <string>

namespace tandem {

std::string formatBytes(uint64_t bytes);  // "512 B", "1.5 KiB", "23.4 GiB"
std::string formatCount(uint64_t count);  // "950", "12.3 K", "30.5 M", "671 B", "1.0 T"

std::string formatDuration(double seconds);               // "0:01:05", as LLaMA-Factory logs time
std::string formatShape(std::span<const int64_t> shape);  // "[2, 3]"

}  // namespace tandem
