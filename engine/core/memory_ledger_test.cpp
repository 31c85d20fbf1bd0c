#include "engine/core/memory_ledger.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/core/memory_labels.h"

namespace tandem {
namespace {

TEST(MemoryLedger, ChargesAndPeaksPerDeviceAndCategory) {
  MemoryLedger ledger;
  ledger.charge("cuda:0", MemoryCategory::Weights, 1000);
  ledger.charge("cuda:0", MemoryCategory::Activations, 500);
  ledger.charge("cpu:numa0", MemoryCategory::Weights, 7);
  ledger.release("cuda:0", MemoryCategory::Activations, 300);

  const DeviceMemoryUsage gpu = ledger.usage("cuda:0");
  EXPECT_EQ(gpu.current(MemoryCategory::Weights), 1000u);
  EXPECT_EQ(gpu.current(MemoryCategory::Activations), 200u);
  EXPECT_EQ(gpu.peak(MemoryCategory::Activations), 500u);
  EXPECT_EQ(gpu.peak_total_bytes, 1500u);
  EXPECT_EQ(gpu.currentTotal(), 1200u);

  const auto all = ledger.snapshot();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].device, "cpu:numa0");
  EXPECT_EQ(all[1].device, "cuda:0");

  ledger.resetPeaks();
  EXPECT_EQ(ledger.usage("cuda:0").peak_total_bytes, 1200u);
  EXPECT_EQ(ledger.usage("nowhere").currentTotal(), 0u);
}

TEST(MemoryLedger, OverReleaseClampsToZero) {
  MemoryLedger ledger;
  ledger.charge("cpu", MemoryCategory::Scratch, 10);
  ledger.release("cpu", MemoryCategory::Scratch, 20);
  EXPECT_EQ(ledger.usage("cpu").current(MemoryCategory::Scratch), 0u);
}

TEST(MemoryLedger, ChargeIsRaiiAndMovable) {
  MemoryLedger ledger;
  {
    MemoryCharge a(ledger, "cpu", MemoryCategory::Lora, 64);
    MemoryCharge b = std::move(a);
    EXPECT_EQ(ledger.usage("cpu").current(MemoryCategory::Lora), 64u);
    MemoryCharge c(ledger, "cpu", MemoryCategory::Lora, 16);
    c = std::move(b);  // releases c's 16, takes b's 64
    EXPECT_EQ(ledger.usage("cpu").current(MemoryCategory::Lora), 64u);
  }
  EXPECT_EQ(ledger.usage("cpu").current(MemoryCategory::Lora), 0u);
  EXPECT_EQ(ledger.usage("cpu").peak(MemoryCategory::Lora), 80u);
}

TEST(MemoryLedger, ConcurrentChargesBalance) {
  MemoryLedger ledger;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        MemoryCharge charge(ledger, "cpu", MemoryCategory::Scratch, 3);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ledger.usage("cpu").currentTotal(), 0u);
  EXPECT_GE(ledger.usage("cpu").peak(MemoryCategory::Scratch), 3u);
}

// Host bytes that name their NUMA node are kept per node beside the device's totals, and leave
// the node when their charge ends (moved charges keep their node).
TEST(MemoryLedger, HostChargesKeepTheirNumaNode) {
  MemoryLedger ledger;
  {
    MemoryCharge on_node1(ledger, "cpu", MemoryCategory::Weights, 3000, 1);
    MemoryCharge on_node0(ledger, "cpu", MemoryCategory::Weights, 500, 0);
    MemoryCharge no_node(ledger, "cpu", MemoryCategory::Weights, 70);
    MemoryCharge scratch(ledger, "cpu", MemoryCategory::Scratch, 9, 1);
    const DeviceMemoryUsage usage = ledger.usage("cpu");
    EXPECT_EQ(usage.current(MemoryCategory::Weights), 3570u);  // totals count every charge
    ASSERT_EQ(usage.by_node.size(), 2u);
    EXPECT_EQ(usage.by_node[0].node, 0);
    EXPECT_EQ(usage.by_node[0].current(MemoryCategory::Weights), 500u);
    EXPECT_EQ(usage.by_node[1].node, 1);
    EXPECT_EQ(usage.by_node[1].current(MemoryCategory::Weights), 3000u);
    EXPECT_EQ(usage.by_node[1].current(MemoryCategory::Scratch), 9u);
    MemoryCharge moved = std::move(on_node1);
    on_node1.reset();  // moved-from: releases nothing
    EXPECT_EQ(ledger.usage("cpu").by_node[1].current(MemoryCategory::Weights), 3000u);
  }
  const DeviceMemoryUsage after = ledger.usage("cpu");
  EXPECT_EQ(after.currentTotal(), 0u);
  for (const NodeMemoryUsage& node : after.by_node) {
    for (uint64_t bytes : node.current_bytes) EXPECT_EQ(bytes, 0u);
  }
}

// Labels name parts of the ledger's bytes while their holder lives; equal labels add up.
TEST(MemoryLabels, LabelsLiveAsLongAsTheirHolder) {
  auto bytesOf = [](const std::string& device, const std::string& label) {
    uint64_t sum = 0;
    for (const LabeledBytes& l : MemoryLabels::global().snapshot())
      if (l.device == device && l.label == label && l.category == MemoryCategory::Weights)
        sum += l.bytes;
    return sum;
  };
  {
    MemoryLabel a("cpu:numa1", MemoryCategory::Weights, "expert packs int8 (test)", 4096);
    MemoryLabel b("cpu:numa1", MemoryCategory::Weights, "expert packs int8 (test)", 1024);
    EXPECT_EQ(bytesOf("cpu:numa1", "expert packs int8 (test)"), 5120u);
    MemoryLabel moved = std::move(a);
    EXPECT_EQ(bytesOf("cpu:numa1", "expert packs int8 (test)"), 5120u);
    b = MemoryLabel();
    EXPECT_EQ(bytesOf("cpu:numa1", "expert packs int8 (test)"), 4096u);
  }
  EXPECT_EQ(bytesOf("cpu:numa1", "expert packs int8 (test)"), 0u);
}

TEST(MemoryLedger, CategoryNames) {
  EXPECT_EQ(memoryCategoryName(MemoryCategory::Optimizer), "optimizer");
  EXPECT_EQ(memoryCategoryName(MemoryCategory::Cache), "cache");
}

}  // namespace
}  // namespace tandem
