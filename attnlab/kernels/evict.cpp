// A timing helper for attnlab's cold measurements (engine/quantize.py): push a tensor out of the caches.
#include <torch/extension.h>

#include <immintrin.h>

// Push a tensor's bytes out of every cache level (timing a decode-sized product as decode meets its weight: coming
// from memory, not left in cache by the previous call). A tensor without plain storage, or not contiguous (its bytes
// are not one range), is left alone.
void evict(torch::Tensor t) {
  if (!t.has_storage() || !t.device().is_cpu() || !t.numel() || !t.is_contiguous()) return;
  const char* p = static_cast<const char*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size();
  for (int64_t i = 0; i < n; i += 64) _mm_clflush(p + i);
  _mm_clflush(p + n - 1);
  _mm_mfence();
}
