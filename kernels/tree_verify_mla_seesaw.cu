// specdiag-arch: sm_90a
// Native MLA tree-verify attention, two math warpgroups taking turns on 64-key tiles (v8,
// "wgmma_seesaw"; the schedule FlashMLA calls "seesaw").
//
// Why (clock() inside v7, tree_verify_mla_ws64.cu, per 64-key tile of ~4,500 cycles on the
// H200): one warpgroup did every Q K^T (~1,750 cycles to issue) and every softmax (~1,700), one
// after the other, while the tensor cores waited through the softmax; the load warpgroup waited
// ~1,100 cycles for its stage because that stage was freed only after the next Q K^T was issued.
//
// Three warpgroups (384 threads), 64 query rows per CTA, 2 stages of 64 keys:
//   * warpgroup c (0 or 1) owns the tiles t with t % 2 == c: it computes S = Q K^T (t) over all
//     576 dims (m64n64k16, A = Q and B = the tile from shared memory), the mask and the lazy
//     online softmax, and writes P (t) (bf16) for the other math warpgroup;
//   * every math warpgroup keeps its half of O (columns 256 c .. 256 c + 255, 128 registers) and
//     adds P V for every tile: its own tile's P from registers (the S accumulator layout is the
//     A-fragment layout), the other's from shared memory;
//   * warpgroup 2 only loads (cp.async; 104 registers, the math warpgroups 200 by setmaxnreg):
//     Q, then each tile into its stage once both math warpgroups are done with the tile before;
//     a tile lands in 3 parts (column blocks 0-2, 3-5, 6-8), and cp.async.mbarrier.arrive makes
//     each part's mbarrier complete when its copies have landed, so the loader never waits for
//     a load and Q K^T starts on the first part (1.01-1.08x over v7 with one mbarrier per tile,
//     1.06-1.16x with three, on the H200).
// One running max serves both O halves: the owner of tile t takes it from tile t - 1's owner
// (with P (t - 1)), moves it lazily (by more than 2^8 only, as v5-v7), and passes it on with P (t)
// and the factor alpha (t) both halves of O are scaled by before P V (t). Each warpgroup sums
// its own tiles' P, scaled by every alpha; the two sums are added in the epilogue.
//
// P (t) goes where tile t's dims 512..575 were: that 8 KB column block is read only by Q K^T (t),
// which is done when P is written, and P V reads only dims 0..511. So each stage carries its
// own P and shared memory holds Q (72 KB) and two stages (144 KB), 216 KB in all.
//
// Math warpgroup c, step for its tile t (tile t - 1 is the other's):
//   (0) its P V (t - 2) done: arrive EMPTY (t - 2) (the loader puts tile t there);
//   (1) wait P_READY (t - 1): rescale O by alpha (t - 1), issue P V (t - 1), P from shared memory;
//   (2) for each part of tile t: wait for its mbarrier, issue its 12 k-steps of Q K^T (t);
//   (3) P V (t - 1) done: arrive EMPTY (t - 1) (the loader puts tile t + 1 there);
//   (4) Q K^T (t) done: softmax, P (t) and the row factors into shared memory, arrive P_READY (t);
//   (5) rescale O by alpha (t), issue P V (t), P from registers.
// P V (t - 1) goes first in (1) so that tile t - 1's stage is freed as soon as its two P V
// halves are done; the other order puts it behind Q K^T (t) in the warpgroup's wgmma queue.
// (Waiting for P V (t - 1) and arriving EMPTY (t - 1) before (2) instead was 3-5% slower.)
// Named barriers (each use's arrivals alternate with its waits; the notes beside them say why):
//   EMPTY0/1   math warpgroups -> loader (256 arrive, 128 wait): stage free
//   P0/P1      owner of tile t -> the other (128 arrive, 128 wait): P (t), alpha (t), max (t)
//   MATH       both math warpgroups, the epilogue's sum exchange
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_wgmma.cuh"

namespace tvsee {
using namespace tvg;
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 64;                        // keys per tile: the N of every Q K^T wgmma
constexpr int BM = 64;                        // query rows per CTA
constexpr int NB = D / 64;                    // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;         // 73728
constexpr int Q_B = NB * BM * 128;            // 73728
constexpr int ROPE_OFF = (NB - 1) * BN * 128;  // 65536: column block 8 (dims 512..575), P's place once Q K^T is done
constexpr int P_B = BM * BN * 2;              // 8192
static_assert(P_B == TILE_B - ROPE_OFF, "P [64 rows][64 keys] bf16 fills the rope block exactly");
constexpr int STAGES = 2;
constexpr int WG = 128;
constexpr int NT = 3 * WG;                    // math warpgroups 0 and 1, loader 2
constexpr int KSTEPS = D / 16;                // k-steps of Q K^T (36)
constexpr int VH = DV / 2;                    // output columns per math warpgroup (256)
constexpr int SN = BN / 2;                    // score registers per thread (32)
// setmaxnreg moves registers between the warpgroups of the CTA's allocation, which is ptxas'
// entry count for 384 threads (65536 / 384 rounded down to 8: 168) x 384: a budget asking for
// more than 3 x 168 per thread in all leaves a math warpgroup's setmaxnreg.inc waiting forever
// (it hung on the H200 at 200 / 112). At 200 / 104 neither part spills (ptxas -v, SASS).
constexpr int ENTRY_REGS = (65536 / NT) & ~7;  // 168
constexpr int MATH_REGS = 200, LOAD_REGS = 104;
static_assert(2 * MATH_REGS + LOAD_REGS <= 3 * ENTRY_REGS, "setmaxnreg budget over the CTA's registers");
constexpr float RESCALE_SLACK = 8.f;          // as v5-v7: P <= 2^8, O rescaled only when a row's max moves more
constexpr int ROWF_B = BM * 4;                // one float per query row
// A tile lands in PARTS parts of column blocks, each on its own mbarrier: Q K^T (t) starts on
// the first part's 12 k-steps while the rest is still arriving.
constexpr int PARTS = 3;
constexpr int PART_BLOCKS = NB / PARTS;  // 3 column blocks, 12 k-steps of Q K^T
static_assert(NB % PARTS == 0, "whole column blocks per part");
static_assert(PARTS * PART_BLOCKS * 4 == KSTEPS, "the parts' k-steps cover Q K^T");
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + 6 * ROWF_B + STAGES * PARTS * 8;  // 222768: Q, stages, alpha[2], max[2], sum[2], mbarriers
constexpr int SMEM_BYTES = SMEM_DATA + 1024;  // 223792 = specdiag.attention.native.smem_bytes(4, "wgmma_seesaw") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0 && ROPE_OFF % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");
static_assert(BN == 64 && VH == 256 && SN == 32, "the 64-key helpers of tree_verify_wgmma.cuh");

template <int V>
struct Const {
  static constexpr int value = V;
};

enum : int { BAR_EMPTY0 = 1, BAR_EMPTY1 = 2, BAR_P0 = 3, BAR_P1 = 4, BAR_MATH = 5 };

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// where tile t's P lives in its stage (stage base + ROPE_OFF), its layout and descriptors
TVG_HD constexpr uint32_t p_buf(uint32_t stage_base) { return stage_base + ROPE_OFF; }
TVG_HD constexpr uint32_t p_offset(int r, int nt, int t4) { return p64_offset(r, nt, t4); }
TVG_HD constexpr uint64_t p_desc(uint32_t buf, int kk) { return p64_desc(buf, kk); }
TVG_HD constexpr uint64_t v_desc(uint32_t tile_base, int wg, int kk) { return v64_desc(tile_base, wg, kk); }

__device__ __forceinline__ void verify_partial_seesaw(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv_pool,
    const int* __restrict__ page_table, const int* __restrict__ prefix_lens,
    const __nv_bfloat16* __restrict__ tree_kv, const uint8_t* __restrict__ tree_mask,
    float* __restrict__ o_part, float* __restrict__ lse_part, int R, int T, int H, int page_size,
    int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t sQ = (raw + 1023u) & ~1023u;  // the swizzle pattern is keyed to 1024-byte address bits
  const uint32_t sK = sQ + Q_B;
  float* s_alpha = reinterpret_cast<float*>(smem + (sK - raw) + STAGES * TILE_B);  // [tile % 2][row]: O's factor before P V (t)
  float* s_max = s_alpha + STAGES * BM;                                             // [tile % 2][row]: the running max after tile t
  float* s_sum = s_max + STAGES * BM;                                               // [warpgroup][row]: its row sums (epilogue)
  const uint32_t full0 = sK + STAGES * TILE_B + 6 * ROWF_B;                         // per stage and part: landed

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2;
  const int wr = (warp & 3) * 16;  // this warp's 16 rows within the CTA's 64 (math warpgroups)
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);
  const int n = w.n_tiles;
  const auto stage = [&](int tile) { return sK + (tile & 1) * TILE_B; };
  const auto full = [&](int tile, int part) { return full0 + 8 * ((tile & 1) * PARTS + part); };
  const auto bar_empty = [](int tile) { return (tile & 1) ? BAR_EMPTY1 : BAR_EMPTY0; };
  const auto bar_p = [](int tile) { return (tile & 1) ? BAR_P1 : BAR_P0; };

  if (tid == 0) {
    for (int i = 0; i < STAGES * PARTS; ++i) mbar_init(full0 + 8 * i, WG);  // the loader's 128 threads arrive (cp.async.mbarrier.arrive) per tile
    mbar_fence_init();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (wg == 2) {
    // ------------------------------------------------ warpgroup 2: every load
    setmaxnreg_dec<LOAD_REGS>();
    if (n > 0) {
      const int t = tid - 2 * WG;
      constexpr int ROWS_T = BN / (WG / 8);  // 4 rows of a tile per thread
      auto pages_of = [&](int tile, int (&pg)[ROWS_T]) { tile_pages<BN, WG>(pg, w, (w.tile_begin + tile) * BN, t, b, page_size, max_pages, page_table); };
      // tile `tile` part by part, each part's arrive completing its mbarrier once this thread's
      // copies so far (Q's too) have landed; the rows' addresses are taken once for all parts
      auto load_tile = [&](int tile, const int (&pg)[ROWS_T]) {
        const int tok0 = (w.tile_begin + tile) * BN;
        const __nv_bfloat16* src[ROWS_T];
        int bytes[ROWS_T];
#pragma unroll
        for (int i = 0; i < ROWS_T; ++i) tvc::key_row_in<D>(w, tok0 + load_row<WG>(t, i), pg[i], b, T, page_size, kv_pool, tree_kv, src[i], bytes[i]);
#pragma unroll
        for (int part = 0; part < PARTS; ++part) {
#pragma unroll
          for (int i = 0; i < ROWS_T; ++i)
#pragma unroll
            for (int c = part * PART_BLOCKS; c < (part + 1) * PART_BLOCKS; ++c) {
              const int chunk = load_chunk(t, c);
              cp_async16(stage(tile) + tile_offset(BN, load_row<WG>(t, i), chunk), src[i] + chunk * 8, bytes[i]);
            }
          cp_async_mbar_arrive(full(tile, part));
        }
      };
      load_q<BM, WG, D>(sQ, t, q, b, R, row0);
      int pg[ROWS_T];
      pages_of(0, pg);
      load_tile(0, pg);
      if (n > 1) {
        pages_of(1, pg);
        load_tile(1, pg);
      }
      for (int j = 0; j + 2 < n; ++j) {
        pages_of(j + 2, pg);
        // both math warpgroups are done with tile j. They arrive EMPTY (j + 2) only after tile
        // j + 2's mbarrier (or P_READY (j + 2)), which needs this load: the uses alternate
        bar_sync(bar_empty(j), NT);
        load_tile(j + 2, pg);
      }
      cp_async_wait<0>();
    }
    return;
  }

  // ------------------------------------------------ warpgroups 0 and 1: the math
  setmaxnreg_inc<MATH_REGS>();
  const int c = wg;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};  // the running max after the last tile seen (both warpgroups)
  float l_r[2] = {0.f, 0.f};              // this thread's share of the row sums of this warpgroup's tiles
  auto fence_o = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  };

  // The loop runs with this warpgroup's first tile C as a compile-time constant: with t starting
  // at a thread-derived value, ptxas takes every wgmma under a t-dependent condition as
  // divergent and serialises them all (C7520).
  auto math = [&](auto first) {
    constexpr int C = decltype(first)::value;
    float s[SN];
    uint32_t a[BN / 16][4];  // P (t) as the A fragments of P V
    float alpha[2];
    // (1) the other warpgroup's tile u: O rescaled by its factor, our half of its P V
    auto other_tile = [&](int u) {
      // the owner arrives P (u + 2) only after tile u + 2 landed, which needs our EMPTY (u) in (3)
      bar_sync(bar_p(u), 2 * WG);
      fence_proxy_async();  // (the tile's V reached us through the owner's barriers)
      const float* al = s_alpha + (u & 1) * BM + wr + g;
      const float* mx = s_max + (u & 1) * BM + wr + g;
      const float au[2] = {al[0], al[8]};
      m_r[0] = mx[0];
      m_r[1] = mx[8];
      l_r[0] *= au[0];
      l_r[1] *= au[1];
      if (__any_sync(0xffffffffu, au[0] != 1.f || au[1] != 1.f)) tvc::rescale_rows(o, au);  // O is idle: (0)
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(p_buf(stage(u)), kk), v_desc(stage(u), C, kk));
    };
    for (int t = C; t < n; t += 2) {
      // (0) our P V (t - 2) is done: the loader may put tile t in its stage (the wait is
      // unconditional so that ptxas sees O idle from here on, whichever the tile)
      wgmma_wait<0>();
      fence_o();
      if (t >= 2) bar_arrive(bar_empty(t), NT);
      if (t >= 1) other_tile(t - 1);
      wgmma_commit();  // (empty for tile 0: the same group count on every path, for (3)'s wait)
      // (2) our tile t: S = Q K^T over all 576 dims, each part's k-steps once it has landed
#pragma unroll
      for (int i = 0; i < SN; ++i) fence_operand(s[i]);
#pragma unroll
      for (int part = 0; part < PARTS; ++part) {
        mbar_wait(full(t, part), (t >> 1) & 1);
        fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
        wgmma_fence();
#pragma unroll
        for (int ks = part * 4 * PART_BLOCKS; ks < (part + 1) * 4 * PART_BLOCKS; ++ks)
          wgmma_qk64(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(t), BN, ks), ks > 0);
      }
      wgmma_commit();
      // (3) our P V (t - 1) is done (it was issued before Q K^T (t)): tile t + 1 may take its stage
      wgmma_wait<1>();
      fence_o();
      if (t >= 1 && t + 1 < n) bar_arrive(bar_empty(t - 1), NT);
      // (4) the softmax of tile t
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < SN; ++i) fence_operand(s[i]);
      fence_o();
      if (!w.is_tree && (w.tile_begin + t + 1) * BN <= w.kv_len) {  // a whole prefix tile: nothing masked
#pragma unroll
        for (int i = 0; i < SN; ++i) s[i] *= scale_log2;
      } else {
        tvc::mask_scores<BN>(s, g, t4, t, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
      }
      const bool rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);
      if (t4 == 0) {
        float* al = s_alpha + (t & 1) * BM + wr + g;
        float* mx = s_max + (t & 1) * BM + wr + g;
        al[0] = alpha[0];
        al[8] = alpha[1];
        mx[0] = m_r[0];
        mx[8] = m_r[1];
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);  // row g, keys 16 kk + 2 t4
        a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);  // row g + 8
        a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);  // row g, keys 16 kk + 8 + 2 t4
        a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);  // row g + 8
      }
      const uint32_t pb = p_buf(stage(t));  // Q K^T (t), the rope block's only reader, is done
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        st_shared_u32(pb + p_offset(wr + g, nt, t4), a[nt >> 1][2 * (nt & 1)]);
        st_shared_u32(pb + p_offset(wr + g + 8, nt, t4), a[nt >> 1][2 * (nt & 1) + 1]);
      }
      fence_proxy_async();  // P is read by the other warpgroup's wgmma (async proxy)
      bar_arrive(bar_p(t), 2 * WG);
      // (5) our half of P V (t), P from registers; O is idle: (3) and (4) waited
      if (rescale) tvc::rescale_rows(o, alpha);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, a[kk], v_desc(stage(t), C, kk));
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_o();
    if (((n - 1) & 1) != C) {  // the last tile is the other's: our half of its P V
      other_tile(n - 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_o();
    }
  };
  if (n > 0) {
    if (c == 0)
      math(Const<0>{});
    else
      math(Const<1>{});
  }

  // ---- epilogue: the whole row sums (both warpgroups' tiles), normalised partial output and its
  // lse (natural log); an empty split: m = -inf, l = 0 ----
  tvc::quad_sum_rows(l_r);
  if (t4 == 0) {  // (m_r is the same in both warpgroups: the max after the last tile)
    s_sum[c * BM + wr + g] = l_r[0];
    s_sum[c * BM + wr + g + 8] = l_r[1];
  }
  bar_sync(BAR_MATH, 2 * WG);
  const float* other = s_sum + (c ^ 1) * BM + wr + g;
  l_r[0] += other[0];
  l_r[1] += other[8];
  tvc::write_partial_rows(o, m_r, l_r, o_part, lse_part, b, NS, split, R, row0 + wr, g, t4, c * VH, c == 0, DV);
}

}  // namespace tvsee

#ifndef TVW_LAYOUT_ONLY
extern "C" __global__ void __launch_bounds__(tvsee::NT, 1) tree_verify_partial_seesaw(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  tvsee::verify_partial_seesaw(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H,
                               page_size, max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS,
                               scale_log2);
}
#endif  // TVW_LAYOUT_ONLY
