// specdiag-arch: sm_90a
// Native MLA tree-verify attention, warp-specialised warpgroups on 64-key tiles (v7, "wgmma_ws64").
//
// The roles of tree_verify_mla_ws.cu (v5): warpgroup 0 computes S = Q K^T over all 576 dims, the
// mask and lazy online softmax, writes P (bf16) to shared memory and does O[:, 0:256] += P V;
// warpgroup 1 issues every key-tile load (cp.async) and does O[:, 256:512] += P V. What changes
// is the tile: 64 keys instead of 32, so every Q K^T wgmma is m64n64k16.
// Why (clock() inside v5 on the H200, per 32-key tile of ~3,000 cycles): issuing the 36 Q K^T
// wgmmas took ~1,300 cycles and the softmax of 16 scores per thread ~1,000, one after the other
// in warpgroup 0; a second accumulator chain changed neither (1-4%). Each m64n32k16 reads 2 KB of
// Q and 1 KB of K from shared memory: 110 KB per 32 keys, most of it Q again. With 64 keys a
// wgmma reads Q once for twice the keys (147 KB per 64 keys instead of 221), and the softmax's
// dependent steps (row max, shuffles, exp2, sum) cover 32 scores per thread instead of 16.
// Shared memory: Q (72 KB) + 2 stages of 64 keys (2 x 72 KB) + one P buffer (8 KB) fills the
// 227 KB: tile j + 2 is loaded into tile j's stage once both warpgroups' P V (j) is done, and P
// (j + 1) is written once warpgroup 1's P V (j) has read P (j).
// Warpgroup 0's step j: P V (j), then (tile j + 1 in shared memory) Q K^T (j + 1), the stage freed
// at P V's wait, the softmax of tile j + 1 once its scores are in (the order the transposed
// kernel found fastest). Named barriers, each over all 256 threads (one warpgroup arrives, the
// other waits):
//   K_READY   wg1 -> wg0   tile j + 1 is in shared memory (wg1's cp.async waited, proxy-fenced)
//   K_FREE    wg0 -> wg1   wg0's P V (j) is done: tile j + 2 may overwrite tile j's stage
//   P_READY   wg0 -> wg1   P (t) and its row factors are in the P buffer
//   P_FREE    wg1 -> wg0   wg1's P V (t) is done: P (t + 1) may overwrite the buffer
// Each barrier's arrivals alternate with its waits (the notes beside each use say why).
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_wgmma.cuh"

namespace tvws64 {
using namespace tvg;
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 64;                 // keys per tile: the N of every Q K^T wgmma
constexpr int BM = 64;                 // query rows per CTA
constexpr int NB = D / 64;             // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;  // 73728
constexpr int Q_B = NB * BM * 128;     // 73728
constexpr int P_B = BM * BN * 2;       // P [64 rows][64 keys] bf16, core-matrix layout (8192), one buffer
constexpr int ROWF_B = BM * 4;         // one float per query row
constexpr int STAGES = 2;
constexpr int NT = 256;
constexpr int WG = 128;
constexpr int KSTEPS = D / 16;         // k-steps of Q K^T (36)
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr int SN = BN / 2;             // score registers per thread (32)
constexpr float RESCALE_SLACK = 8.f;   // as tree_verify_mla_ws.cu: P <= 2^8, O rescaled only when a row's max moves more
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + P_B + 3 * ROWF_B;  // 230144: Q, stages, P, alpha, m, l
constexpr int SMEM_BYTES = SMEM_DATA + 1024;  // 231168 = specdiag.attention.native.smem_bytes(4, "wgmma_ws64") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");

enum : int { BAR_K_READY = 1, BAR_K_FREE = 2, BAR_P_READY = 3, BAR_P_FREE = 4, BAR_WG0 = 5 };

// ---- layout arithmetic (tree_verify_wgmma.cuh, shared with tree_verify_mla_seesaw.cu), host-callable
// (tests/cuda/wgmma_layout_check.cu): P [64 rows][64 keys] in its buffer, the A operand of P V
// from it, the B operand (V) of warpgroup wg's P V ----
static_assert(BN == 64 && VH == 256 && SN == 32, "the 64-key helpers of tree_verify_wgmma.cuh");
TVG_HD constexpr uint32_t p_offset(int r, int nt, int t4) { return p64_offset(r, nt, t4); }
TVG_HD constexpr uint64_t p_desc(uint32_t p_buf, int kk) { return p64_desc(p_buf, kk); }
TVG_HD constexpr uint64_t v_desc(uint32_t tile_base, int wg, int kk) { return v64_desc(tile_base, wg, kk); }

__device__ __forceinline__ void verify_partial_ws64(
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
  float* s_alpha = reinterpret_cast<float*>(smem + (sP - raw) + P_B);  // per row: factor for O before P V (t)
  float* s_m = s_alpha + BM;                                            // per row: final max and sum (epilogue)
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
  auto fence_o = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  };
  auto issue_pv = [&](int tile) {  // O[:, 256 wg ..] += P V (tile), P from the buffer (asynchronous)
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP, kk), v_desc(stage(tile), wg, kk));
    wgmma_commit();
  };

  if (n > 0) {
    load_q<BM, NT, D>(sQ, tid, q, b, R, row0);
    cp_async_commit();

    if (wg == 1) {
      // ------------------------------------------------ warpgroup 1: loads, O[:, 256:512]
      const int t = tid - WG;
      constexpr int ROWS_T = BN / (WG / 8);  // 4 rows of a tile per thread; pages read a load ahead (tile_pages)
      auto pages_of = [&](int tile, int (&pg)[ROWS_T]) { tile_pages<BN, WG>(pg, w, (w.tile_begin + tile) * BN, t, b, page_size, max_pages, page_table); };
      auto load_tile = [&](int tile, const int (&pg)[ROWS_T]) {
        load_paged_tile<BN, WG, D>(stage(tile), pg, w, (w.tile_begin + tile) * BN, t, b, T, page_size, kv_pool, tree_kv);
      };
      int pg[ROWS_T];
      start_two_stages(n, pg, pages_of, load_tile);  // cp.async groups: Q, tiles 0, 1, then one per iteration (tile j + 2)
      __syncthreads();  // (1) Q and tile 0 visible to both warpgroups

      for (int j = 0; j < n; ++j) {
        // wg0 arrives P_READY again (tile j + 1) only after waiting for our P_FREE (j) below
        bar_sync(BAR_P_READY, NT);
        const float alpha[2] = {s_alpha[wr + g], s_alpha[wr + g + 8]};
        fence_o();
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) tvc::rescale_rows(o, alpha);
        wgmma_fence();
        issue_pv(j);
        if (j + 1 < n) {
          cp_async_wait<0>();  // tile j + 1 (issued last iteration, or before the loop)
          fence_proxy_async();
          bar_arrive(BAR_K_READY, NT);  // wg0 waits for it in step j, before it arrives P_READY (j + 1), our next wait
        }
        wgmma_wait<0>();
        fence_o();
        // P (j) read (and alpha (j), above): wg0 may write P (j + 1); it waits for this in its
        // softmax of tile j + 1, before it arrives P_READY (j + 1), our next wait
        if (j + 1 < n) bar_arrive(BAR_P_FREE, NT);
        if (j + 2 < n) {
          // tile j + 2 goes where tile j was: wait for wg0's P V (j), which it signals before its
          // Q K^T (j + 1) is done. wg0 arrives K_FREE again (step j + 1) only after its K_READY
          // wait of step j + 1, which we arrive next iteration, after this wait
          bar_sync(BAR_K_FREE, NT);
          load_tile(j + 2, pg);
          if (j + 3 < n) pages_of(j + 3, pg);  // used next iteration
          cp_async_commit();
        }
      }
      __syncthreads();  // (2) wg0 has left the final max and row sums in s_m / s_l
      tvc::get_row_stats(s_m, s_l, m_r, l_r, wr + g);
    } else {
      // ------------------------------------------------ warpgroup 0: scores, softmax, O[:, 0:256]
      cp_async_wait<0>();  // our share of Q
      fence_proxy_async();
      __syncthreads();  // (1)

      float s[SN];
      float alpha[2];
      bool rescale = false;  // some row of this warp moved its reference max on the last softmax_tile
      auto issue_qk = [&](int tile) {  // S = Q K^T (tile) over all 576 dims (asynchronous)
#pragma unroll
        for (int i = 0; i < SN; ++i) fence_operand(s[i]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) wgmma_qk64(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(tile), BN, ks), ks > 0);
        wgmma_commit();
      };
      // S of `tile` (its Q K^T waited for) -> masked online softmax -> P (bf16) and the row
      // factors into the buffer for both warpgroups' P V; arrives P_READY.
      auto softmax_tile = [&](int tile) {
#pragma unroll
        for (int i = 0; i < SN; ++i) fence_operand(s[i]);
        if (!w.is_tree && (w.tile_begin + tile + 1) * BN <= w.kv_len) {  // a whole prefix tile: nothing masked
#pragma unroll
          for (int i = 0; i < SN; ++i) s[i] *= scale_log2;
        } else {
          tvc::mask_scores<BN>(s, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
        }
        rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);
        // wg1 is done with P (tile - 1) (our own P V (tile - 1) was waited for in step tile - 1);
        // wg1 arrives P_FREE again only after P_READY (tile), which we arrive below
        if (tile >= 1) bar_sync(BAR_P_FREE, NT);
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          st_shared_u32(sP + p_offset(wr + g, nt, t4), pack_bf16(s[4 * nt + 0], s[4 * nt + 1]));
          st_shared_u32(sP + p_offset(wr + g + 8, nt, t4), pack_bf16(s[4 * nt + 2], s[4 * nt + 3]));
        }
        if (t4 == 0) {
          s_alpha[wr + g] = alpha[0];
          s_alpha[wr + g + 8] = alpha[1];
        }
        fence_proxy_async();    // P is read by wgmma (async proxy)
        bar_sync(BAR_WG0, WG);  // ... by ours too: every warp's share of P in place
        bar_arrive(BAR_P_READY, NT);
      };

      issue_qk(0);
      wgmma_wait<0>();
      softmax_tile(0);  // O is still zero: nothing to rescale
      for (int j = 0; j + 1 < n; ++j) {
        fence_o();
        wgmma_fence();
        issue_pv(j);
        bar_sync(BAR_K_READY, NT);  // tile j + 1 in shared memory
        issue_qk(j + 1);            // the tensor cores interleave it with P V (j): separate registers
        wgmma_wait<1>();            // P V (j) done, Q K^T (j + 1) may run on
        fence_o();
        // tile j's stage is free on our side: wg1 loads tile j + 2 there (it waits in its
        // iteration j, after it arrived the K_READY we waited for); our next K_FREE (step j + 1)
        // comes after step j + 1's K_READY wait, which wg1 arrives after that wait
        if (j + 2 < n) bar_arrive(BAR_K_FREE, NT);
        wgmma_wait<0>();
        softmax_tile(j + 1);
        if (rescale) tvc::rescale_rows(o, alpha);
      }
      fence_o();
      wgmma_fence();
      issue_pv(n - 1);
      wgmma_wait<0>();
      fence_o();
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

}  // namespace tvws64

#ifndef TVW_LAYOUT_ONLY
extern "C" __global__ void __launch_bounds__(tvws64::NT, 1) tree_verify_partial_ws64(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  tvws64::verify_partial_ws64(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H,
                              page_size, max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS,
                              scale_log2);
}
#endif  // TVW_LAYOUT_ONLY
