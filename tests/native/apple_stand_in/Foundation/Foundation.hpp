// Stand-in for metal-cpp's <Foundation/Foundation.hpp>: the NS declarations
// that MLX's Metal backend headers and csrc/ use, written from Apple's public
// metal-cpp API for the Linux syntax check of the Apple sources. Declarations
// only: nothing here is ever linked, and nothing in the shipped build includes it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace NS {

using Integer = std::intptr_t;
using UInteger = std::uintptr_t;

class Object {
 public:
  void release();
  UInteger retainCount() const;
};

// metal-cpp's CRTP base: retain and autorelease return the derived type.
template <class Derived, class Base = Object>
class Referencing : public Base {
 public:
  Derived* retain();
  Derived* autorelease();
};

// Owns one reference to an Objective-C object (retain on copy, release on destruction).
template <class T>
class SharedPtr {
 public:
  SharedPtr();
  SharedPtr(std::nullptr_t);
  SharedPtr(const SharedPtr& other);
  SharedPtr(SharedPtr&& other) noexcept;
  ~SharedPtr();
  SharedPtr& operator=(const SharedPtr& other);
  SharedPtr& operator=(SharedPtr&& other) noexcept;
  T* get() const;
  T* operator->() const;
  explicit operator bool() const;
  void reset();
  void detach();
};

// Adopts a +1 reference (from alloc/new/copy), or retains a borrowed one.
template <class T>
SharedPtr<T> TransferPtr(T* object);
template <class T>
SharedPtr<T> RetainPtr(T* object);

enum StringEncoding : UInteger {
  ASCIIStringEncoding = 1,
  UTF8StringEncoding = 4,
};

class String : public Referencing<String> {
 public:
  static String* string(const char* cString, StringEncoding encoding);
  const char* utf8String() const;
  UInteger length() const;
};

class Error : public Referencing<Error> {
 public:
  Integer code() const;
  String* localizedDescription() const;
};

class AutoreleasePool : public Object {
 public:
  static AutoreleasePool* alloc();
  AutoreleasePool* init();
  void drain();
};

}  // namespace NS
