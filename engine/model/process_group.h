#pragma once
// One data-parallel job's process group: PyTorch's c10d (a TCPStore rendezvous, Gloo
// collectives) behind a torch-free face, so that engine/train can hold one. Every collective is
// called in the same order on every rank; each waits at most the job's timeout, and a peer that
// died or stalled becomes a tandem::Error naming the rank (or ranks) it could be.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace tandem::model {

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank on this node: which GPU it would own
  int local_world_size = 1;  // ranks on this node
  std::string master_addr;   // the rendezvous server's address; rank 0 listens there, only there
  int master_port = 29500;
  std::chrono::seconds timeout{1800};  // for the rendezvous and for every collective
};

class ProcessGroup {
 public:
  // Rendezvous with the other ranks: rank 0 serves the TCPStore on master_addr:master_port (bound
  // to that address, not a wildcard), the others connect; then the Gloo group forms. Throws
  // Error when the address cannot be bound or a rank does not arrive within the timeout.
  static std::unique_ptr<ProcessGroup> join(const ProcessGroupOptions& options);
  // Whether this build can join a job (it was built with Gloo's headers; CMake says so).
  static bool available();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int worldSize() const;
  // One line for the log: backend, where tensors travel, why (e.g. ranks that share a GPU).
  std::string describe() const;

  // In-place sums / maxima over all ranks of a few host values (losses, token counts, flags).
  // `what` names the exchange in the error if a peer fails during it.
  void allReduceSum(std::span<double> values, const std::string& what);
  void allReduceMax(std::span<double> values, const std::string& what);
  // Throws Error unless every rank passed the same value (e.g. a dataset's hash).
  void requireSameOnAllRanks(double value, const std::string& what, const std::string& fix);
  void barrier(const std::string& what);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::model
