// The one argument of every tree-verify kernel (the partial kernels and the merge): the host packs
// it once per call (specdiag.attention.native.VerifyParams mirrors it; a test compares the layouts).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace tv {

constexpr int D = 576;   // latent row: 512 latent + 64 rope
constexpr int DV = 512;  // value width: V is the first 512 of a latent row

struct VerifyParams {
  const __nv_bfloat16* q;        // [B, R, D] bf16, query row r = node * H + head
  const __nv_bfloat16* kv_pool;  // [pages, page_size, D] bf16, the paged prefix latents
  const int* page_table;         // [B, max_pages] int32, pool page of each prefix page
  const int* prefix_lens;        // [B] int32, prefix tokens of each request
  const __nv_bfloat16* tree_kv;  // [B, T, D] bf16, the tree nodes' latents
  const uint8_t* tree_mask;      // [B, T, T] uint8, [b][i][j] != 0: node j is node i or its ancestor
  float* o_part;                 // [B, NS, R, DV] fp32, each split's normalised output
  float* lse_part;               // [B, NS, R] fp32, each split's log-sum-exp (natural log)
  __nv_bfloat16* out;            // [B, R, DV] bf16, the merged output
  float* lse;                    // [B, R] fp32, the merged log-sum-exp
  int R;                         // query rows per request (T * H)
  int T;                         // tree nodes per request
  int H;                         // query heads
  int page_size;                 // tokens per pool page
  uint32_t page_magic;           // n / page_size == (umulhi(n, page_magic) + n) >> page_shift for 0 <= n < 2^31
  int page_shift;                //   (specdiag.attention.native.page_divider; no division in the loaders)
  int max_pages;                 // page_table columns
  int n_prefix_splits;           // splits over the prefix (blockIdx.y below it), then tree splits
  int prefix_tiles_per_split;    // key tiles per prefix split
  int tree_tiles_per_split;      // key tiles per tree split
  int NS;                        // splits in all
  float scale_log2;              // softmax scale * log2(e)
  const uint64_t* tree_bits;     // [B, T, tree_words] bit k of word j of [b][i]: tree_mask[b][i][64 j + k]
  int tree_words;                //   (specdiag.attention.native.tree_mask_bits; read where a module exports tree_bits = 1)
};

}  // namespace tv

// A kernel module's launch shape, read by the host at load time and checked against the registry
// (specdiag.attention.registry): threads per CTA, query rows per CTA, keys per tile, dynamic
// shared memory in bytes; and whether it reads VerifyParams::tree_bits (1: the host packs them).
#define TV_EXPORT_CONFIG(THREADS, ROWS, KEYS, SMEM, TREE_BITS) \
  extern "C" __device__ const int tv_config[5] = {(THREADS), (ROWS), (KEYS), (int)(SMEM), (TREE_BITS)};

// A partial kernel's entry point: NS::verify_partial on NS::NT threads (one CTA per SM), with the
// module's exported launch shape (NS::TREE_BITS: whether it reads the packed mask).
#define TV_DEFINE_PARTIAL_KERNEL(NS, ENTRY)                                                       \
  TV_EXPORT_CONFIG(NS::NT, NS::BM, NS::BN, NS::SMEM_BYTES, NS::TREE_BITS)                         \
  extern "C" __global__ void __launch_bounds__(NS::NT, 1) ENTRY(const __grid_constant__ tv::VerifyParams p) { \
    NS::verify_partial(p);                                                                        \
  }
