// Stand-in for metal-cpp's <Metal/Metal.hpp>: the MTL declarations that MLX's
// Metal backend headers (device.h, resident.h, allocator.h, event.h, utils.h)
// and csrc/ use, written from Apple's public metal-cpp API for the Linux syntax
// check of the Apple sources. Only what is used is declared, so a new Metal
// call fails the check until its declaration is added here from Apple's
// documentation. Declarations only: nothing here is ever linked.
#pragma once

#include <cstdint>

#include <Foundation/Foundation.hpp>

namespace MTL {

class Device;
class Heap;

// MTLDataType: the raw values are Apple's (function constants pass them to Metal).
enum DataType : NS::UInteger {
  DataTypeNone = 0,
  DataTypeFloat = 3,
  DataTypeHalf = 16,
  DataTypeInt = 29,
  DataTypeUInt = 33,
  DataTypeBool = 53,
};

// MTLSize: a grid or threadgroup extent in threads or threadgroups.
struct Size {
  Size();
  Size(NS::UInteger width, NS::UInteger height, NS::UInteger depth);
  static Size Make(NS::UInteger width, NS::UInteger height, NS::UInteger depth);

  NS::UInteger width;
  NS::UInteger height;
  NS::UInteger depth;
};

class Allocation : public NS::Referencing<Allocation> {
 public:
  NS::UInteger allocatedSize() const;
};

class Resource : public NS::Referencing<Resource, Allocation> {
 public:
  Device* device() const;
  Heap* heap() const;
};

class Buffer : public NS::Referencing<Buffer, Resource> {
 public:
  void* contents();
  NS::UInteger length() const;
};

class Heap : public NS::Referencing<Heap> {
 public:
  NS::UInteger size() const;
};

class Function : public NS::Referencing<Function> {
 public:
  NS::String* name() const;
};

class LinkedFunctions : public NS::Referencing<LinkedFunctions> {};

class Library : public NS::Referencing<Library> {
 public:
  Function* newFunction(const NS::String* functionName);
};

class ComputePipelineState : public NS::Referencing<ComputePipelineState> {
 public:
  NS::UInteger maxTotalThreadsPerThreadgroup() const;
  NS::UInteger threadExecutionWidth() const;
  NS::UInteger staticThreadgroupMemoryLength() const;
};

class Fence : public NS::Referencing<Fence> {};

class SharedEvent : public NS::Referencing<SharedEvent> {
 public:
  std::uint64_t signaledValue() const;
  void setSignaledValue(std::uint64_t value);
};

class ResidencySet : public NS::Referencing<ResidencySet> {
 public:
  void addAllocation(const Allocation* allocation);
  void removeAllocation(const Allocation* allocation);
  void commit();
  void requestResidency();
};

class ComputeCommandEncoder : public NS::Referencing<ComputeCommandEncoder> {
 public:
  void setComputePipelineState(const ComputePipelineState* state);
  void setBytes(const void* bytes, NS::UInteger length, NS::UInteger index);
  void setBuffer(const Buffer* buffer, NS::UInteger offset, NS::UInteger index);
  void setThreadgroupMemoryLength(NS::UInteger length, NS::UInteger index);
  void dispatchThreadgroups(Size threadgroupsPerGrid, Size threadsPerThreadgroup);
  void dispatchThreads(Size threadsPerGrid, Size threadsPerThreadgroup);
  void endEncoding();
};

class CommandBuffer : public NS::Referencing<CommandBuffer> {
 public:
  void commit();
  void waitUntilCompleted();
  NS::Error* error() const;
  NS::String* label() const;
  void setLabel(const NS::String* label);
};

class CommandQueue : public NS::Referencing<CommandQueue> {
 public:
  CommandBuffer* commandBuffer();
  void setLabel(const NS::String* label);
};

class Device : public NS::Referencing<Device> {
 public:
  NS::String* name() const;
  CommandQueue* newCommandQueue();
};

}  // namespace MTL
