// The one translation unit that includes c10d. ProcessGroupGloo.hpp includes Gloo's headers,
// which the torch wheel does not ship; Debian's libgloo-dev provides them (CMake finds them and
// defines TANDEM_HAVE_C10D_GLOO). Those headers are older than the Gloo inside the wheel, so
// this file touches no Gloo type's layout: devices come from the wheel's own exported
// ProcessGroupGloo::createDeviceFor* (shared_ptrs passed through untouched), Options from its
// exported constructor, and the group is used only through c10d::Backend's virtual interface.
// tests/train/test_distributed.py runs real multi-process all-reduces through this path.

#include "engine/model/process_group.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/core/platform/tcp_listen.h"
#include "engine/model/process_group_tensors.h"

#ifdef TANDEM_HAVE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace tandem::model {

#ifdef TANDEM_HAVE_C10D_GLOO

namespace {

// A peer as it introduced itself at the rendezvous: for naming it when it fails.
struct PeerInfo {
  std::string host;     // gethostname()
  std::string address;  // the address its Gloo device listens on
  long pid = 0;
};

bool isLoopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

// The first line of a c10d / Gloo message, without its source-file prefix.
std::string firstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > 1 && line[0] == '[') {
    if (const size_t end = line.find("] "); end != std::string::npos) line = line.substr(end + 2);
  }
  return line;
}

// The address of this machine that reaches `master` (the route's source address): the Gloo
// device binds there, a specific interface instead of whatever the host name resolves to.
std::string localAddressTowards(const std::string& master, int port) {
  if (isLoopback(master)) return master == "localhost" ? "127.0.0.1" : master;
  return platform::localAddressTowards(master, port);
}

// Why Gloo carries GPU gradients (through host copies) instead of NCCL.
std::string gpuNote(const ProcessGroupOptions& options) {
  const int gpus =
      at::detail::getCUDAHooks().hasCUDA() ? at::detail::getCUDAHooks().deviceCount() : 0;
  if (gpus <= 0) return "";
  const char* own_gpu = std::getenv("TANDEM_GPU_PER_RANK");  // tandem launch gave each rank one
  if (options.local_world_size > gpus && !(own_gpu && *own_gpu == '1')) {
    return "; " + std::to_string(options.local_world_size) + " ranks on this node share " +
           std::to_string(gpus) + " GPU(s) and NCCL wants one GPU per rank, so Gloo carries the " +
           "GPU gradients through host memory";
  }
  return "; the GPU gradients go through host memory (Gloo; NCCL is not used yet)";
}

std::vector<uint8_t> bytesOf(const std::string& text) { return {text.begin(), text.end()}; }

}  // namespace

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> gloo;
  std::map<int, PeerInfo> peers;
  std::string note;

  // The ranks a failure message points at: those whose Gloo address the message names, or on
  // this host those whose process is gone; with two ranks, the other one.
  std::string suspects(const std::string& message) const {
    std::vector<int> named, gone;
    const std::string here = platform::hostName();
    for (const auto& [rank, peer] : peers) {
      if (rank == options.rank) continue;
      if (!peer.address.empty() && message.find("[" + peer.address + "]") != std::string::npos)
        named.push_back(rank);
      if (peer.host == here && peer.pid > 0 && platform::processIsGone(peer.pid))
        gone.push_back(rank);
    }
    std::vector<int> ranks = !gone.empty() ? gone : named;
    if (ranks.empty() && options.world_size == 2) ranks.push_back(1 - options.rank);
    if (ranks.empty()) return "another rank";
    std::string text = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) {
      const PeerInfo& p = peers.at(ranks[i]);
      text += (i ? ", " : "") + std::to_string(ranks[i]) + " (pid " + std::to_string(p.pid) +
              " on " + p.host + ")";
    }
    return text;
  }

  [[noreturn]] void fail(const std::string& what, const std::exception& e) const {
    const std::string cause = firstLine(e.what());
    const bool timed_out =
        cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
    throw Error("rank " + std::to_string(options.rank) + ": " + suspects(cause) +
                    (timed_out ? " did not answer within ddp_timeout (" +
                                     std::to_string(options.timeout.count()) + " s)"
                               : " left the job") +
                    " during " + what + " (" + cause + ")",
                "the job stopped here; the last checkpoint in output_dir is intact. See that "
                "rank's own output for why it stopped, then start the job again on every node: "
                "it resumes from that checkpoint");
  }

  void run(std::vector<at::Tensor>& tensors, c10d::ReduceOp op, const std::string& what) {
    try {
      c10d::AllreduceOptions opts;
      opts.reduceOp = op;
      opts.timeout = options.timeout;
      gloo->allreduce(tensors, opts)->wait();
    } catch (const std::exception& e) {
      fail(what, e);
    }
  }
};

std::unique_ptr<ProcessGroup> ProcessGroup::join(const ProcessGroupOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string endpoint = options.master_addr + ":" + std::to_string(options.master_port);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(options.master_port);
  store_options.isServer = options.rank == 0;
  store_options.numWorkers = static_cast<size_t>(options.world_size);
  store_options.timeout = options.timeout;
  if (store_options.isServer)
    store_options.masterListenFd = platform::listenTcp(options.master_addr, options.master_port);
  const std::string address = localAddressTowards(options.master_addr, options.master_port);
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    // Each rank says who it is, then reads everyone's: failures later name ranks from this table.
    impl->store->set("tandem/rank/" + std::to_string(options.rank),
                     bytesOf(platform::hostName() + "\n" + address + "\n" +
                             std::to_string(platform::currentProcessId())));
    for (int r = 0; r < options.world_size; ++r) {
      const std::vector<uint8_t> raw = impl->store->get("tandem/rank/" + std::to_string(r));
      std::istringstream in(std::string(raw.begin(), raw.end()));
      PeerInfo peer;
      std::getline(in, peer.host);
      std::getline(in, peer.address);
      in >> peer.pid;
      impl->peers[r] = peer;
    }
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    if (interface && *interface) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    } else if (!address.empty()) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(address));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, options.rank,
                                                             options.world_size, gloo_options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(options.rank) + " could not join the job at " + endpoint +
                    " within ddp_timeout (" + std::to_string(options.timeout.count()) +
                    " s): " + firstLine(e.what()),
                "start every rank (WORLD_SIZE " + std::to_string(options.world_size) +
                    ") with the same MASTER_ADDR:MASTER_PORT, and open that port and the "
                    "ranks' Gloo ports between the nodes (docs/distributed.md)");
  }
  impl->note = "process group: rank " + std::to_string(options.rank) + " of " +
               std::to_string(options.world_size) + ", rendezvous at " + endpoint +
               ", gradients all-reduced by Gloo over TCP" +
               (address.empty() ? "" : " from " + address) + gpuNote(options);
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

bool ProcessGroup::available() { return true; }

void ProcessGroup::allReduceSum(std::span<double> values, const std::string& what) {
  std::vector<at::Tensor> tensors{
      at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kDouble)};
  impl_->run(tensors, c10d::ReduceOp::SUM, what);
}

void ProcessGroup::allReduceMax(std::span<double> values, const std::string& what) {
  std::vector<at::Tensor> tensors{
      at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kDouble)};
  impl_->run(tensors, c10d::ReduceOp::MAX, what);
}

void ProcessGroup::barrier(const std::string& what) {
  double token = 0;
  allReduceSum({&token, 1}, what);
}

void allReduceSumTensors(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                         const std::string& what) {
  // Buckets of at most 25 MiB, as torch's DDP: few messages, bounded staging memory.
  constexpr int64_t kBucketElements = (25 << 20) / sizeof(float);
  std::vector<at::Tensor> direct;  // contiguous CPU fp32 buffers: reduced in place
  std::vector<std::vector<at::Tensor>> buckets;
  int64_t filled = kBucketElements;
  for (const at::Tensor& t : tensors) {
    if (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
        t.numel() >= kBucketElements / 16) {
      direct.push_back(t);
      continue;
    }
    if (filled + t.numel() > kBucketElements) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(t);
    filled += t.numel();
  }
  // Every bucket is queued before the first wait: Gloo's worker threads overlap them.
  std::vector<at::Tensor> flats;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  ProcessGroup::Impl& impl = group.impl();
  try {
    c10d::AllreduceOptions opts;
    opts.timeout = impl.options.timeout;
    for (const std::vector<at::Tensor>& bucket : buckets) {
      std::vector<at::Tensor> flat_parts;
      for (const at::Tensor& t : bucket)
        flat_parts.push_back(t.detach().reshape({-1}).to(at::kCPU, at::kFloat));
      flats.push_back(at::cat(flat_parts));
      std::vector<at::Tensor> one{flats.back()};
      works.push_back(impl.gloo->allreduce(one, opts));
    }
    for (const at::Tensor& t : direct) {
      std::vector<at::Tensor> one{t};
      works.push_back(impl.gloo->allreduce(one, opts));
    }
    for (auto& work : works) work->wait();
  } catch (const std::exception& e) {
    impl.fail(what, e);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t offset = 0;
    for (const at::Tensor& t : buckets[b]) {
      t.detach().copy_(flats[b].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

#else  // no Gloo headers at build time: the same API, refusing to join

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  std::string note;
};

std::unique_ptr<ProcessGroup> ProcessGroup::join(const ProcessGroupOptions&) {
  throw Error(
      "this build of Tandem cannot join a distributed job (it was built without Gloo's "
      "headers)",
      "install libgloo-dev (scripts/setup.sh does) and rebuild, or unset WORLD_SIZE / "
      "RANK to train on this machine alone");
}

bool ProcessGroup::available() { return false; }
void ProcessGroup::allReduceSum(std::span<double>, const std::string&) {}
void ProcessGroup::allReduceMax(std::span<double>, const std::string&) {}
void ProcessGroup::barrier(const std::string&) {}
void allReduceSumTensors(ProcessGroup&, const std::vector<at::Tensor>&, const std::string&) {}

#endif

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->options.rank; }
int ProcessGroup::worldSize() const { return impl_->options.world_size; }
std::string ProcessGroup::describe() const { return impl_->note; }

void ProcessGroup::requireSameOnAllRanks(double value, const std::string& what,
                                         const std::string& fix) {
  double extremes[2] = {value, -value};
  allReduceMax(extremes, "the check that every rank has the same " + what);
  if (extremes[0] != value || -extremes[1] != value) {
    throw Error("the ranks of this job do not have the same " + what + " (rank " +
                    std::to_string(rank()) + " has " + std::to_string(value) +
                    ", another rank up to " + std::to_string(extremes[0]) + ")",
                fix);
  }
}

}  // namespace tandem::model
