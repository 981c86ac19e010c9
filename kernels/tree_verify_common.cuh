// Shared by every partial kernel: which keys a CTA owns, the score masking, the online softmax of
// one thread's two query rows, and the epilogue that writes a split's normalised output and LSE.
//
// Scores and outputs are held in the mma.m16n8k16 / wgmma accumulator order: for 8-column tile n,
// entries 4n + e (e = 0..3) are (row g, columns 2 t4 and 2 t4 + 1) then (row g + 8, the same
// columns), with g = lane / 4 and t4 = lane % 4.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_params.cuh"

namespace tvc {
using tv::VerifyParams;

// The keys split `split` of request `b` walks: prefix splits first (no mask), then tree splits
// (ancestor mask), in tiles of BN keys.
struct SplitWork {
  bool is_tree;
  int kv_len;      // keys of this part (prefix length, or T tree nodes)
  int tile_begin;  // first tile of this split
  int n_tiles;     // tiles of this split (0 when the split is past the end)
};

template <int BN>
__device__ __forceinline__ SplitWork split_work(const VerifyParams& p, int split, int b) {
  SplitWork w;
  w.is_tree = split >= p.n_prefix_splits;
  int tile_end;
  if (!w.is_tree) {
    w.kv_len = p.prefix_lens[b];
    w.tile_begin = split * p.prefix_tiles_per_split;
    tile_end = min(w.tile_begin + p.prefix_tiles_per_split, (w.kv_len + BN - 1) / BN);
  } else {
    w.kv_len = p.T;
    w.tile_begin = (split - p.n_prefix_splits) * p.tree_tiles_per_split;
    tile_end = min(w.tile_begin + p.tree_tiles_per_split, (p.T + BN - 1) / BN);
  }
  w.n_tiles = max(0, tile_end - w.tile_begin);
  return w;
}

// Row stride (floats) of the partial-S exchange: BN + 8 puts a half-warp's float2 accesses (rows
// g..g+3, columns 2 t4) in 32 different banks; a stride of BN made them 8-way conflicts.
template <int BN>
__host__ __device__ constexpr int s_stride() { return BN + 8; }

// Store this thread's partial scores (its warp's 16 rows) at `mine` (row 0 of the warp).
template <int BN>
__device__ __forceinline__ void store_partial_s(float* mine, const float (&s)[BN / 2], int g, int t4) {
  constexpr int SS = s_stride<BN>();
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
    *reinterpret_cast<float2*>(&mine[g * SS + nt * 8 + 2 * t4]) = make_float2(s[4 * nt], s[4 * nt + 1]);
    *reinterpret_cast<float2*>(&mine[(g + 8) * SS + nt * 8 + 2 * t4]) = make_float2(s[4 * nt + 2], s[4 * nt + 3]);
  }
}

// The pool's page size where the build fixes it (-DTV_PAGE_SIZE=N, 1 for DDTree's one-token pages;
// the host checks it against the pool: native.build_defines), 0: read from the params.
#ifndef TV_PAGE_SIZE
#define TV_PAGE_SIZE 0
#endif
__device__ __forceinline__ int page_size(const VerifyParams& p) { return TV_PAGE_SIZE > 0 ? TV_PAGE_SIZE : p.page_size; }

// tok / page_size for 0 <= tok < 2^31, by the host's multiplier (a division per row slowed the loaders).
__device__ __forceinline__ int page_of(const VerifyParams& p, int tok) {
  if constexpr (TV_PAGE_SIZE > 0)
    return tok / TV_PAGE_SIZE;
  else
    return (int)((__umulhi((uint32_t)tok, p.page_magic) + (uint32_t)tok) >> p.page_shift);
}

// The pool page of prefix key `tok` (clamped into the prefix; 0 for tree keys, which have none).
__device__ __forceinline__ int key_page(const VerifyParams& p, const SplitWork& w, int tok, int b) {
  const int tk = tok < w.kv_len ? tok : 0;
  return w.is_tree ? 0 : __ldg(p.page_table + (size_t)b * p.max_pages + page_of(p, tk));
}

// Where key `tok` of this split's part starts, given its page (key_page), and the cp.async byte
// count: 16, or 0 past the end (the copy then zero-fills from a valid row). Tree keys are the
// request's nodes in order.
__device__ __forceinline__ void key_row_in(const VerifyParams& p, const SplitWork& w, int tok, int page, int b,
                                           const __nv_bfloat16*& src, int& bytes) {
  const bool ok = tok < w.kv_len;
  const int tk = ok ? tok : 0;
  src = w.is_tree ? p.tree_kv + ((size_t)b * p.T + tk) * tv::D
                  : p.kv_pool + ((size_t)page * page_size(p) + (tk - page_of(p, tk) * page_size(p))) * tv::D;
  bytes = ok ? 16 : 0;
}

// key_row_in with the page looked up here.
__device__ __forceinline__ void key_row(const VerifyParams& p, const SplitWork& w, int tok, int b,
                                        const __nv_bfloat16*& src, int& bytes) {
  key_row_in(p, w, tok, key_page(p, w, tok, b), b, src, bytes);
}

// Whether key `tok` of this split's part is visible to query row `grow`: inside the part, and in
// the tree the row's node or one of its ancestors.
__device__ __forceinline__ bool key_visible(const VerifyParams& p, int tok, const SplitWork& w, int grow, int b) {
  bool vis = tok < w.kv_len;
  if (w.is_tree && vis) {
    const int node = min(grow, p.R - 1) / p.H;
    vis = p.tree_mask[((size_t)b * p.T + node) * p.T + tok] != 0;
  }
  return vis;
}

// key_visible for a tree part, the mask byte loaded from a valid index and the result selected: no
// branch per load, so that a tile's loads are in flight together rather than each waited out in turn
__device__ __forceinline__ bool tree_key_visible(const VerifyParams& p, int tok, const SplitWork& w, int grow, int b) {
  const bool in = tok < w.kv_len;
  const int node = min(grow, p.R - 1) / p.H;
  return in & (__ldg(p.tree_mask + ((size_t)b * p.T + node) * p.T + (in ? tok : 0)) != 0);
}

// visible(tok, row) for each of this thread's score slots (row 0 or 1: g or g + 8), with the
// prefix case (no mask loads) split from the tree case up front, so that the prefix's bounds test
// compiles to selects rather than a branch per slot. LOADS_TOGETHER: the tree through
// tree_key_visible (the seesaw kernel keeps key_visible: with the other its loads spilled and its
// loop ran slower; docs/kernel_notes.md, thirtieth session)
template <int BN, bool LOADS_TOGETHER, class Apply>
__device__ __forceinline__ void for_each_visible(const VerifyParams& p, const SplitWork& w, int grow0, int b, Apply apply) {
  if (!w.is_tree) {
    apply([&](int tok, int) { return tok < w.kv_len; });
  } else if constexpr (LOADS_TOGETHER) {
    apply([&](int tok, int rl) { return tree_key_visible(p, tok, w, grow0 + rl, b); });
  } else {
    apply([&](int tok, int rl) { return key_visible(p, tok, w, grow0 + rl, b); });
  }
}

// s: this thread's share (BN / 2 values) of its warp's S -> s * scale_log2 (SCALE; else s), or
// -inf where the key is not visible. grow0: query row of the warp's row 0.
template <int BN, bool SCALE = true>
__device__ __forceinline__ void mask_scores(const VerifyParams& p, float (&s)[BN / 2], int g, int t4, int tile,
                                            const SplitWork& w, int grow0, int b) {
  const int tok0 = (w.tile_begin + tile) * BN;
  for_each_visible<BN, false>(p, w, grow0, b, [&](auto visible) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // rows g (e < 2) and g + 8, columns 2 t4 + e % 2
        const int tok = tok0 + nt * 8 + 2 * t4 + (e & 1);
        const float v = s[4 * nt + e];
        s[4 * nt + e] = visible(tok, g + (e >> 1) * 8) ? (SCALE ? v * p.scale_log2 : v) : -INFINITY;
      }
  });
}

// s -> s * scale_log2 (SCALE; else s), or -inf where the key is not visible, from the visible-key
// bits of the thread's rows g (vis0) and g + 8 (vis1) over the tile's BN keys (bit k: key k).
// Each 32-key half is shifted by the thread's column once; a score's bit is then at a constant,
// and a bitwise select on it (no predicate) puts -inf's bits in place: a hidden key's score is
// dropped even when it is NaN, as the reference drops it.
template <int BN, bool SCALE = true>
__device__ __forceinline__ void mask_scores_bits(const VerifyParams& p, float (&s)[BN / 2], uint64_t vis0, uint64_t vis1, int t4) {
  static_assert(BN == 64, "a row's bits are one 64-bit word");
  const uint32_t w[2][2] = {{(uint32_t)vis0 >> (2 * t4), (uint32_t)(vis0 >> 32) >> (2 * t4)},
                            {(uint32_t)vis1 >> (2 * t4), (uint32_t)(vis1 >> 32) >> (2 * t4)}};
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // rows g (e < 2) and g + 8, key nt * 8 + 2 t4 + e % 2
      // the bit moved to the sign and spread: 0 for a visible key, else all ones -> -inf's bits
      const int hidden = ~((int)(w[e >> 1][nt >> 2] << (31 - (nt & 3) * 8 - (e & 1))) >> 31);
      const float v = SCALE ? s[4 * nt + e] * p.scale_log2 : s[4 * nt + e];
      s[4 * nt + e] = __int_as_float((__float_as_int(v) & ~hidden) | (hidden & 0xff800000));
    }
}

// Query row grow's visible-key bits over the tree's BN-key tile `tile` (BN = 64: one word of the
// host's packed mask, VerifyParams::tree_bits)
__device__ __forceinline__ uint64_t tree_word(const VerifyParams& p, int b, int grow, int tile) {
  const int node = min(grow, p.R - 1) / p.H;
  return __ldg(p.tree_bits + ((size_t)b * p.T + node) * p.tree_words + tile);
}

// s: this thread's share of its warp's partial S over half the head dims; other: the partner's
// (store_partial_s layout). Leaves s = (mine + other) * scale_log2, or -inf where not visible.
template <int BN>
__device__ __forceinline__ void combine_and_mask(const VerifyParams& p, float (&s)[BN / 2], const float* other, int g,
                                                 int t4, int tile, const SplitWork& w, int grow0, int b) {
  constexpr int SS = s_stride<BN>();
  const int tok0 = (w.tile_begin + tile) * BN;
  for_each_visible<BN, true>(p, w, grow0, b, [&](auto visible) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows g and g + 8
        const int rl = g + h * 8;
        const int col = nt * 8 + 2 * t4;
        const float2 y = *reinterpret_cast<const float2*>(&other[rl * SS + col]);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int e = 2 * h + c;
          const float x = (s[4 * nt + e] + (c ? y.y : y.x)) * p.scale_log2;
          s[4 * nt + e] = visible(tok0 + col + c, rl) ? x : -INFINITY;
        }
      }
    }
  });
}

// The max over this thread's quad of row r (0: g, 1: g + 8) of a tile's scores.
template <int BN>
__device__ __forceinline__ float quad_row_max(const float (&s)[BN / 2], int r) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// exp2 of a score: FAST, one ex2.approx.ftz (a result under 2^-126, a key that far below the row's
// max, becomes 0); else exp2f, which keeps such results as denormals at three more instructions
template <bool FAST>
__device__ __forceinline__ float score_exp2(float x) {
  if constexpr (FAST) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// Row r's scores -> exp2(s - m_use) in place, or with a scale exp2(s * scale - m_use) (one FFMA
// and the exponent each; m_use in the scaled units); returns this thread's share of their sum.
template <int BN, bool FAST = false, bool SCALED = false>
__device__ __forceinline__ float exp2_row(float (&s)[BN / 2], int r, float m_use, float scale = 1.f) {
  const auto arg = [&](float x) { return SCALED ? fmaf(x, scale, -m_use) : x - m_use; };
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
    s[4 * nt + 2 * r] = score_exp2<FAST>(arg(s[4 * nt + 2 * r]));
    s[4 * nt + 2 * r + 1] = score_exp2<FAST>(arg(s[4 * nt + 2 * r + 1]));
    sum += s[4 * nt + 2 * r] + s[4 * nt + 2 * r + 1];
  }
  return sum;
}

// Online softmax in the log2 domain over one tile, rows g and g + 8: updates the running max m_r
// and this thread's share of the sum l_r, turns s into P, and returns each row's factor for O.
template <int BN>
__device__ __forceinline__ void online_softmax(float (&s)[BN / 2], float (&m_r)[2], float (&l_r)[2], float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m_r[r], quad_row_max<BN>(s, r));
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = exp2f(m_r[r] - m_use);
    m_r[r] = m_new;
    l_r[r] = l_r[r] * alpha[r] + exp2_row<BN>(s, r, m_use);
  }
}

// online_softmax with a lazily moved reference max (FlashAttention-4's conditional rescale): m_r
// moves only when the tile's max exceeds it by more than `slack` (log2 units), so P <= 2^slack and
// on most tiles alpha = 1. Returns whether any row of the warp moved (warp-uniform). FAST: score_exp2.
template <int BN, bool FAST = false>
__device__ __forceinline__ bool online_softmax_lazy(float (&s)[BN / 2], float (&m_r)[2], float (&l_r)[2],
                                                    float (&alpha)[2], float slack) {
  bool moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mx = quad_row_max<BN>(s, r);
    const bool move = mx > m_r[r] + slack;  // also when m_r is still -inf and the tile has a visible key
    const float m_new = move ? mx : m_r[r];
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = move ? exp2f(m_r[r] - m_use) : 1.f;
    m_r[r] = m_new;
    moved |= move;
    l_r[r] = l_r[r] * alpha[r] + exp2_row<BN, FAST>(s, r, m_use);
  }
  return __any_sync(0xffffffffu, moved);
}

// Scale a thread's NO output values (NO / 4 tiles of 8 columns, two rows) by each row's alpha.
template <int NO>
__device__ __forceinline__ void rescale_rows(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < NO / 4; ++i) {
    o[4 * i + 0] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// P of a 16-key step kk as the bf16 A fragments of an m16n8k16 / wgmma (the S accumulator order
// is the A-fragment order): rows g and g + 8, keys 16 kk + 2 t4 (+1) and 16 kk + 8 + 2 t4 (+1).
template <int N>
__device__ __forceinline__ void pack_p(uint32_t (&a)[4], const float (&s)[N], int kk) {
  a[0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
  a[1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
  a[2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
  a[3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
}

// The whole row sums of rows g and g + 8 from this thread's share (the quad holds a row).
__device__ __forceinline__ void quad_sum_rows(float (&l_r)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_r[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_r[r] = l;
  }
}

// index of row `row` of request b's split `split` in lse_part (o_part: times DV)
__device__ __forceinline__ size_t partial_row(const VerifyParams& p, int b, int split, int row) {
  return ((size_t)b * p.NS + split) * p.R + row;
}

// 1 / l of a row sum, 0 for an empty row (l = 0); a NaN sum stays NaN: bad inputs must show
__device__ __forceinline__ float inv_sum(float l) { return l == 0.f ? 0.f : 1.f / l; }
// a partial row's lse in natural-log units from its max m (log2 units) and sum l; -inf when empty
__device__ __forceinline__ float partial_lse(float m, float l) {
  return l == 0.f ? -INFINITY : (m + log2f(l)) * 0.69314718055994531f;
}

// Epilogue with whole row sums l_r: O / l of rows grow0 + g and grow0 + g + 8 (columns col0 + 8 i
// + 2 t4, +1) into o_part[b][split][row], and lse = (m + log2 l) ln 2 from the thread with write_lse.
template <int NO>
__device__ __forceinline__ void write_partial_rows(const VerifyParams& p, const float (&o)[NO], const float (&m_r)[2],
                                                   const float (&l_r)[2], int b, int split, int grow0, int g, int t4,
                                                   int col0, bool write_lse) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int grow = grow0 + g + r * 8;
    if (grow >= p.R) continue;
    const float inv = inv_sum(l_r[r]);
    float* dst = p.o_part + partial_row(p, b, split, grow) * tv::DV + col0 + 2 * t4;
#pragma unroll
    for (int i = 0; i < NO / 4; ++i)
      *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
    if (write_lse && t4 == 0)
      p.lse_part[partial_row(p, b, split, grow)] = partial_lse(m_r[r], l_r[r]);
  }
}

// Epilogue from this thread's share of the row sums (kernels whose threads all hold m and l).
template <int NO>
__device__ __forceinline__ void write_partial(const VerifyParams& p, const float (&o)[NO], const float (&m_r)[2],
                                              float (&l_r)[2], int b, int split, int grow0, int g, int t4, int col0,
                                              bool write_lse) {
  quad_sum_rows(l_r);
  write_partial_rows(p, o, m_r, l_r, b, split, grow0, g, t4, col0, write_lse);
}

}  // namespace tvc
