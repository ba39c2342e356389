// Stand-in for <IOKit/IOKitLib.h>: the IORegistry C API the GPU core probe
// (csrc/dispatch/dispatch_env.cpp) uses, written from Apple's public
// documentation for the Linux syntax check of the Apple sources.
// Declarations only: nothing here is ever linked.
#pragma once

#include <cstdint>

#include <CoreFoundation/CoreFoundation.h>

extern "C" {

typedef int kern_return_t;
#define KERN_SUCCESS 0

typedef unsigned int mach_port_t;
typedef mach_port_t io_object_t;
typedef io_object_t io_iterator_t;
typedef io_object_t io_service_t;
typedef io_object_t io_registry_entry_t;
typedef std::uint32_t IOOptionBits;

// The default main port (macOS 12 renamed kIOMasterPortDefault).
extern const mach_port_t kIOMainPortDefault;

CFMutableDictionaryRef IOServiceMatching(const char* name);
// Consumes one reference to `matching`.
kern_return_t IOServiceGetMatchingServices(mach_port_t mainPort, CFDictionaryRef matching,
                                           io_iterator_t* existing);
io_object_t IOIteratorNext(io_iterator_t iterator);
CFTypeRef IORegistryEntryCreateCFProperty(io_registry_entry_t entry, CFStringRef key,
                                          CFAllocatorRef allocator, IOOptionBits options);
kern_return_t IOObjectRelease(io_object_t object);

}  // extern "C"
