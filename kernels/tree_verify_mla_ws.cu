// specdiag-arch: sm_90a
// Native MLA tree-verify attention, Hopper warpgroup MMA with warp-specialised warpgroups (v5).
//
// Same contract, launch grid, split-KV partials, 32-key tiles and LSE merge as
// tree_verify_mla_wgmma.cu (v4); what changes is who does what. v4's two warpgroups each computed
// half of every Q K^T, exchanged the partial scores through shared memory, both ran the softmax
// and met at a CTA-wide barrier on every tile. Here the roles are split (FlashMLA's structure):
//   * warpgroup 0 (threads 0-127): S = Q K^T over all 576 head dims (36 x wgmma.m64n32k16, Q and
//     K from shared memory), the mask and online softmax, P written to shared memory as bf16
//     (two buffers, by tile parity), and O[:, 0:256] += P V;
//   * warpgroup 1 (threads 128-255): every key-tile load (cp.async, 4 stages, issued 3 tiles
//     ahead; any page size, each row's page index read one load ahead) and O[:, 256:512] += P V, each row rescaled by the factor warpgroup 0
//     left beside P. Both read P from shared memory (no P registers: no spills at 255).
// The softmax moves each row's reference max lazily (online_softmax_lazy, slack 2^8), so on
// most tiles of a long prefix neither warpgroup rescales its 128 output registers.
// Warpgroup 0 keeps LA = 1 or 2 Q K^T ahead (two entry points; 2 is FlashAttention-3's
// intra-warpgroup pipelining): in step j it issues Q K^T (j + LA), then P V (j), then does the
// softmax of tile j + 1 while the tensor cores run them. The warpgroups meet only at named barriers, each over all 256 threads (one
// warpgroup arrives, the other waits); [x] = one barrier per parity x of the tile:
//   K_READY     wg1 -> wg0   tile j + LA is in shared memory (wg1's cp.async waited, proxy-fenced)
//   P_READY[x]  wg0 -> wg1   P (t) and its row factors are in P buffer x = t % 2
//   P_FREE[x]   wg1 -> wg0   wg1's P V (t) is done: P (t + 2) may overwrite buffer x
//   K_FREE[x]   wg0 -> wg1   wg0's P V (t) is done: tile t + 4 may overwrite tile t's stage
// Each barrier's arrivals alternate with its waits (the notes beside each use say why), so no
// barrier ever sees a second round of arrivals before the wait of the first.
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#include "tree_verify_common.cuh"
#include "tree_verify_wgmma.cuh"

namespace tvws {
using namespace tvg;
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 32;                 // keys per tile
constexpr int BM = 64;                 // query rows per CTA
constexpr int NB = D / 64;             // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;  // 36864
constexpr int Q_B = NB * BM * 128;     // 73728
constexpr int P_BUF = BM * BN * 2;     // P [64 rows][32 keys] bf16, core-matrix layout (4096)
constexpr int P_B = 2 * P_BUF;         // two P buffers (8192)
constexpr int ROWF_B = BM * 4;         // one float per query row
constexpr int STAGES = 4;
constexpr int NT = 256;
constexpr int WG = 128;
constexpr int KSTEPS = D / 16;         // k-steps of Q K^T (36)
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr float RESCALE_SLACK = 8.f;   // online_softmax_lazy: P <= 2^8, O rescaled only when a row's max moves more
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + P_B + 4 * ROWF_B;  // 230400: Q, stages, P x 2, alpha x 2, m, l
constexpr int SMEM_BYTES = SMEM_DATA + 1024;  // 231424 = specdiag.attention.native.smem_bytes(4, "wgmma_ws") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");

// named barriers (0 is __syncthreads); the [x] pairs are indexed by tile parity
enum : int { BAR_K_READY = 1, BAR_K_FREE = 2, BAR_P_READY = 4, BAR_P_FREE = 6, BAR_WG0 = 8 };

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// P buffer: 8-row x 16-byte core matrices, chunk c (keys 8 c ..) of row r at (r / 8) * 512 +
// c * 128 + (r % 8) * 16. Where this thread's P values of 8-key group nt go: row r, keys
// 8 nt + 2 t4 and + 1 (4 bytes)
TVG_HD constexpr uint32_t p_offset(int r, int nt, int t4) { return (uint32_t)((r >> 3) * 512 + nt * 128 + (r & 7) * 16 + 4 * t4); }
// A operand of P V: keys 16 kk .. 16 kk + 15 of a P buffer, K-major, no swizzle
TVG_HD constexpr uint64_t p_desc(uint32_t p_buf, int kk) { return make_desc_interleave(p_buf + kk * 256, 128, 512); }
// B operand of warpgroup `wg`'s P V: keys 16 kk .., columns 256 wg ..
TVG_HD constexpr uint64_t v_desc(uint32_t tile_base, int wg, int kk) { return mn_desc(tile_base, BN, wg * (VH / 64), kk); }

// LA (lookahead): wg0 issues Q K^T of tile j + LA before P V of tile j (1 or 2). With 2, the
// softmax of tile j + 1 overlaps Q K^T (j + 2) too, but of the 4 stages only one is left for a
// tile in flight (P V, scored, Q K^T, loading) instead of two: the loads get shallower.
template <int LA>
__device__ __forceinline__ void verify_partial_ws(
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
  const uint32_t sP = sK + STAGES * TILE_B;
  float* s_alpha = reinterpret_cast<float*>(smem + (sP - raw) + P_B);  // [parity][row]: factor for O before P V (t)
  float* s_m = s_alpha + 2 * BM;                                        // per row: final max and sum (epilogue)
  float* s_l = s_m + BM;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2;
  const int wr = (warp & 3) * 16;  // this warp's 16 rows within the CTA's 64 (both warpgroups)
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);
  const int n = w.n_tiles;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};
  const auto stage = [&](int tile) { return sK + (tile % STAGES) * TILE_B; };

  if (n > 0) {
    load_q<BM, NT, D>(sQ, tid, q, b, R, row0);
    cp_async_commit();

    if (wg == 1) {
      // ------------------------------------------------ warpgroup 1: loads, O[:, 256:512]
      const int t = tid - WG;
      constexpr int ROWS_T = BN / (WG / 8);  // 2 rows of a tile per thread; pages read a load ahead (tile_pages)
      auto pages_of = [&](int tile, int (&pg)[ROWS_T]) { tile_pages<BN, WG>(pg, w, (w.tile_begin + tile) * BN, t, b, page_size, max_pages, page_table); };
      auto load_tile = [&](int tile, const int (&pg)[ROWS_T]) {
        load_paged_tile<BN, WG, D>(stage(tile), pg, w, (w.tile_begin + tile) * BN, t, b, T, page_size, kv_pool, tree_kv);
      };
      int pg[ROWS_T];
      // cp.async groups: Q, tiles 0, 1, 2, then one per iteration (tile j + 3, or empty)
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) {
          pages_of(s, pg);
          load_tile(s, pg);
        }
        cp_async_commit();
      }
      if (STAGES - 1 < n) pages_of(STAGES - 1, pg);
      cp_async_wait<STAGES - 1 - LA>();  // Q and tiles 0 .. LA - 1 (wg0 starts with Q K^T of those)
      fence_proxy_async();
      __syncthreads();  // (1) Q and tiles 0 .. LA - 1 visible to both warpgroups

      for (int j = 0; j < n; ++j) {
        // wg0 arrives P_READY[j % 2] once per tile of that parity, the next time (tile j + 2) only
        // after waiting for our P_FREE[j % 2] (j) below
        bar_sync(BAR_P_READY + (j & 1), NT);
        const float alpha[2] = {s_alpha[(j & 1) * BM + wr + g], s_alpha[(j & 1) * BM + wr + g + 8]};
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) tvc::rescale_rows(o, alpha);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP + (j & 1) * P_BUF, kk), v_desc(stage(j), 1, kk));
        wgmma_commit();
        if (j + LA < n) {
          cp_async_wait<2 - LA>();  // our copies of tile j + LA (LA = 2: the newest group; 1: the one before)
          fence_proxy_async();
          bar_arrive(BAR_K_READY, NT);  // wg0 waits for it in step j, before it arrives P_READY (j + 1), our next wait
        }
        if (j + STAGES - 1 < n) {
          // tile j + 3 goes where tile j - 1 was: wait until wg0's P V (j - 1) is done (our own
          // finished last iteration). Tile 3's stage was never used. wg0 arrives K_FREE[x] again
          // (tile j + 1) only after step j + 1 began, which waits for our K_READY of iteration
          // j + 1: after this wait.
          if (j > 0) bar_sync(BAR_K_FREE + ((j - 1) & 1), NT);
          load_tile(j + STAGES - 1, pg);
          if (j + STAGES < n) pages_of(j + STAGES, pg);  // used next iteration
        }
        cp_async_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if (j + 2 < n) bar_arrive(BAR_P_FREE + (j & 1), NT);  // wg0 may write P (j + 2) and its factors there
      }
      __syncthreads();  // (2) wg0 has left the final max and row sums in s_m / s_l
      tvc::get_row_stats(s_m, s_l, m_r, l_r, wr + g);
    } else {
      // ------------------------------------------------ warpgroup 0: scores, softmax, O[:, 0:256]
      cp_async_wait<0>();  // our share of Q
      fence_proxy_async();
      __syncthreads();  // (1)

      using Scores = float[16];
      Scores s_even, s_odd;  // S of tile t lands in s_even / s_odd by t's parity
      float alpha[2];
      bool rescale = false;  // some row of this warp moved its reference max on the last softmax_tile
      auto issue_qk = [&](int tile, Scores& s) {  // S = Q K^T (tile) over all 576 dims (asynchronous)
#pragma unroll
        for (int i = 0; i < 16; ++i) fence_operand(s[i]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) wgmma_qk(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(tile), BN, ks), ks > 0);
        wgmma_commit();
      };
      auto issue_pv = [&](int tile) {  // O[:, 0:256] += P V (tile), P from its buffer (asynchronous)
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP + (tile & 1) * P_BUF, kk), v_desc(stage(tile), 0, kk));
        wgmma_commit();
      };
      // S of `tile` (its Q K^T waited for) -> masked online softmax -> P (bf16) and the row
      // factors into buffer tile % 2 for both warpgroups' P V; arrives P_READY[tile % 2].
      auto softmax_tile = [&](int tile, Scores& s) {
#pragma unroll
        for (int i = 0; i < 16; ++i) fence_operand(s[i]);
        tvc::mask_scores<BN>(s, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
        rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);
        const int x = tile & 1;
        // wg1 is done with P (tile - 2), the last user of this buffer (our own P V (tile - 2)
        // was waited for in step tile - 2); wg1 arrives P_FREE[x] again only after P_READY[x]
        // (tile), which we arrive below
        if (tile >= 2) bar_sync(BAR_P_FREE + x, NT);
        const uint32_t buf = sP + x * P_BUF;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          st_shared_u32(buf + p_offset(wr + g, nt, t4), pack_bf16(s[4 * nt + 0], s[4 * nt + 1]));
          st_shared_u32(buf + p_offset(wr + g + 8, nt, t4), pack_bf16(s[4 * nt + 2], s[4 * nt + 3]));
        }
        if (t4 == 0) {
          s_alpha[x * BM + wr + g] = alpha[0];
          s_alpha[x * BM + wr + g + 8] = alpha[1];
        }
        fence_proxy_async();       // P is read by wgmma (async proxy)
        bar_sync(BAR_WG0, WG);     // ... by ours too: every warp's share of P in place
        bar_arrive(BAR_P_READY + x, NT);
      };
      // One tile j < n - 1: S (j + 1) is in flight into `s_this`; Q K^T (j + 2) is issued into
      // `s_next` (when ahead: j + 2 < n) before P V (j), so the softmax of tile j + 1 runs while
      // the tensor cores do both. Called with the score sets swapped on alternate tiles (a copy
      // between register sets made ptxas serialise the wgmma pipeline, C7513); `ahead` is a
      // compile-time constant at every call, so each call is straight-line code.
      // (LA = 1: Q K^T (j + 1) is issued here into `s_this`, `s_next` and `ahead` are unused.)
      auto step = [&](int j, Scores& s_this, Scores& s_next, auto ahead) {
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if constexpr (LA == 1) {
          bar_sync(BAR_K_READY, NT);  // tile j + 1 in shared memory
          issue_qk(j + 1, s_this);
        } else if constexpr (decltype(ahead)::value) {
          bar_sync(BAR_K_READY, NT);  // tile j + 2 in shared memory
          issue_qk(j + 2, s_next);
        } else {
          wgmma_fence();
        }
        issue_pv(j);
        if constexpr (LA == 2 && decltype(ahead)::value) wgmma_wait<2>();  // Q K^T (j + 1) done; (j + 2) and P V (j) may run
        else wgmma_wait<1>();  // Q K^T (j + 1) done, P V (j) may run
        softmax_tile(j + 1, s_this);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if (rescale) tvc::rescale_rows(o, alpha);
        // tile j's stage is free on our side: wg1 loads tile j + 4 there (it waits in its
        // iteration j + 1); our next K_FREE[j % 2] (tile j + 2) comes after step j + 2 waited for
        // K_READY from wg1's iteration j + 2, after that wait
        if (j + STAGES < n) bar_arrive(BAR_K_FREE + (j & 1), NT);
      };
      auto last = [&]() {
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        wgmma_fence();
        issue_pv(n - 1);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
      };
      using Ahead = std::integral_constant<bool, true>;
      using Last = std::integral_constant<bool, false>;

      issue_qk(0, s_even);
      wgmma_wait<0>();
      softmax_tile(0, s_even);  // O is still zero: nothing to rescale
      if (LA == 2 && n > 1) issue_qk(1, s_odd);  // tiles 0 and 1 were ready at barrier (1)
      int j = 0;
      for (; j + 3 < n; j += 2) {
        step(j, s_odd, s_even, Ahead{});
        step(j + 1, s_even, s_odd, Ahead{});
      }
      // j even, at most two tiles before the last one left
      if (j + 2 < n) {
        step(j, s_odd, s_even, Ahead{});
        step(j + 1, s_even, s_odd, Last{});
      } else if (j + 1 < n) {
        step(j, s_odd, s_even, Last{});
      }
      last();
      tvc::quad_sum_rows(l_r);
      if (t4 == 0) tvc::put_row_stats(s_m, s_l, m_r, l_r, wr + g);
      __syncthreads();  // (2)
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: normalised partial output and its lse (natural log); l_r is whole-row here
  // (an empty split: m = -inf, l = 0 in both warpgroups) ----
  tvc::write_partial_rows(o, m_r, l_r, o_part, lse_part, b, NS, split, R, row0 + wr, g, t4, wg * VH, wg == 0, DV);
}

}  // namespace tvws

#ifndef TVW_LAYOUT_ONLY
#define TVWS_ENTRY(NAME, LA)                                                                                       \
  extern "C" __global__ void __launch_bounds__(tvws::NT, 1) NAME(                                                  \
      const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,         \
      const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H, \
      int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split,     \
      int NS, float scale_log2) {                                                                                  \
    tvws::verify_partial_ws<LA>(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T,   \
                                H, page_size, max_pages, n_prefix_splits, prefix_tiles_per_split,                  \
                                tree_tiles_per_split, NS, scale_log2);                                             \
  }
TVWS_ENTRY(tree_verify_partial_ws, 1)      // Q K^T one tile ahead of P V
TVWS_ENTRY(tree_verify_partial_ws_la2, 2)  // two tiles ahead
#endif  // TVW_LAYOUT_ONLY
