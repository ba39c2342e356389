// Stand-in for <CoreFoundation/CoreFoundation.h>: the CoreFoundation C API the
// IORegistry probe (csrc/dispatch/dispatch_env.cpp) uses, written from Apple's
// public documentation for the Linux syntax check of the Apple sources.
// Declarations only: nothing here is ever linked.
#pragma once

#include <cstdint>

extern "C" {

typedef unsigned char Boolean;
typedef long CFIndex;
typedef unsigned long CFTypeID;
typedef const void* CFTypeRef;
typedef const struct __CFAllocator* CFAllocatorRef;
typedef const struct __CFString* CFStringRef;
typedef const struct __CFNumber* CFNumberRef;
typedef const struct __CFDictionary* CFDictionaryRef;
typedef struct __CFDictionary* CFMutableDictionaryRef;

enum CFNumberType : CFIndex {
  kCFNumberSInt32Type = 3,
  kCFNumberSInt64Type = 4,
  kCFNumberIntType = 9,
  kCFNumberLongType = 10,
};

extern const CFAllocatorRef kCFAllocatorDefault;

CFTypeID CFGetTypeID(CFTypeRef cf);
void CFRelease(CFTypeRef cf);
CFTypeID CFNumberGetTypeID(void);
Boolean CFNumberGetValue(CFNumberRef number, CFNumberType theType, void* valuePtr);

// CFSTR takes a string literal only (the "" on each side reject anything else).
CFStringRef vllm_metal_stand_in_constant_string(const char* cStr);
#define CFSTR(cStr) vllm_metal_stand_in_constant_string("" cStr "")

}  // extern "C"
