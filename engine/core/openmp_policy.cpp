#include "engine/core/openmp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace tandem {

void restartWithPassiveOpenMpWait(char** argv) {
  if (!std::getenv("OMP_WAIT_POLICY") && ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0) {
    ::execv("/proc/self/exe", argv);
  }
}

}  // namespace tandem
