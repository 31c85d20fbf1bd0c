#pragma once
// For tests: libtorch's CPU allocator wrapped so that one chosen allocation fails the way the
// CUDA caching allocator fails when a GPU is full (c10::OutOfMemoryError), to test what a user
// sees when memory runs out mid-run without needing a GPU or a full machine. No libtorch in this
// header, so tests of torch-free code (the trainer, the generator) can use it.

namespace tandem::gpu::testing {

// Installs the wrapper for the rest of the test program (once; later calls do nothing). It
// passes every allocation through until failCpuAllocationIn.
void installFailingCpuAllocator();

// The n-th libtorch CPU allocation from now (n >= 1) fails, once. Installs the wrapper first.
void failCpuAllocationIn(int n);

// The same, failing the way libtorch's own CPU allocator fails when the host is full (a c10::Error
// "DefaultCPUAllocator: not enough memory"), not as a full GPU does.
void failHostAllocationIn(int n);

}  // namespace tandem::gpu::testing
