#pragma once

// Recycled<T>: a base that keeps the memory of freed T objects for the next T of its thread.
// For objects made and freed at a high rate on a worker's loop whose size is above malloc's
// per-thread cache (1 KiB): an HTTP/2 stream per request (1.8 KiB) otherwise goes through
// malloc's bins on each new and delete, and its large requests make malloc consolidate its
// small free chunks (2.6% of Sluice's CPU on rate limit service calls). Up to Keep blocks are
// kept per thread (returned to malloc when the thread ends); T must be the class made (final).
// Under AddressSanitizer nothing is kept, so that a use after free is still caught.

#include <cstddef>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_RECYCLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLUICE_RECYCLE 0
#endif
#endif
#ifndef SLUICE_RECYCLE
#define SLUICE_RECYCLE 1
#endif

namespace sluice {

template <class T, size_t Keep = 64>
class Recycled {
 public:
  static void* operator new(size_t size) {
    if (SLUICE_RECYCLE && size == sizeof(T)) {
      std::vector<void*>& blocks = freeBlocks().blocks;
      if (!blocks.empty()) {
        void* block = blocks.back();
        blocks.pop_back();
        return block;
      }
    }
    return ::operator new(size);
  }
  static void operator delete(void* block, size_t size) noexcept {
    if (SLUICE_RECYCLE && size == sizeof(T)) {
      FreeBlocks& list = freeBlocks();
      if (list.blocks.size() < Keep) {
        list.blocks.push_back(block);  // (capacity reserved: no allocation, cannot throw)
        return;
      }
    }
    ::operator delete(block);
  }

  // Blocks kept by this thread now (for tests).
  static size_t kept() { return freeBlocks().blocks.size(); }

 private:
  struct FreeBlocks {
    FreeBlocks() { blocks.reserve(Keep); }
    ~FreeBlocks() {
      for (void* block : blocks) ::operator delete(block);
    }
    std::vector<void*> blocks;
  };
  static FreeBlocks& freeBlocks() {
    thread_local FreeBlocks list;
    return list;
  }
};

}  // namespace sluice
