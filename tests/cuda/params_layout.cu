// Prints the layout of tv::VerifyParams (kernels/tree_verify_params.cuh), one "field offset size"
// line each and "sizeof N" last, for tests/test_native.py to compare with the host's ctypes mirror.
#include <cstddef>
#include <cstdio>

#include "../../kernels/tree_verify_params.cuh"

#define FIELD(f) std::printf("%s %zu %zu\n", #f, offsetof(tv::VerifyParams, f), sizeof(tv::VerifyParams::f))

int main() {
  FIELD(q);
  FIELD(kv_pool);
  FIELD(page_table);
  FIELD(prefix_lens);
  FIELD(tree_kv);
  FIELD(tree_mask);
  FIELD(o_part);
  FIELD(lse_part);
  FIELD(out);
  FIELD(lse);
  FIELD(R);
  FIELD(T);
  FIELD(H);
  FIELD(page_size);
  FIELD(page_magic);
  FIELD(page_shift);
  FIELD(max_pages);
  FIELD(n_prefix_splits);
  FIELD(prefix_tiles_per_split);
  FIELD(tree_tiles_per_split);
  FIELD(NS);
  FIELD(scale_log2);
  FIELD(tree_bits);
  FIELD(tree_words);
  std::printf("sizeof %zu\n", sizeof(tv::VerifyParams));
  return 0;
}
