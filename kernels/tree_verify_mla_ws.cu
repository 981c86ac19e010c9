// specdiag-arch: sm_90a
// Native MLA tree-verify attention, Hopper warpgroup MMA with warp-specialised warpgroups (v5).
//
// Same contract, launch grid, split-KV partials, 32-key tiles and LSE merge as
// tree_verify_mla_wgmma.cu (v4); what changes is who does what. v4's two warpgroups each computed
// half of every Q K^T, exchanged the partial scores through shared memory, both ran the softmax
// and met at a CTA-wide barrier on every tile. Here the roles are split (FlashMLA's structure):
//   * warpgroup 0 (threads 0-127): S = Q K^T over all 576 head dims (36 x wgmma.m64n32k16, Q and
//     K from shared memory), the mask and online softmax, P written to shared memory as bf16,
//     and O[:, 0:256] += P V with P from registers;
//   * warpgroup 1 (threads 128-255): every key-tile load (cp.async, 4 stages, issued 3 tiles
//     ahead; any page size) and O[:, 256:512] += P V with P read from shared memory, each row
//     rescaled by the factor warpgroup 0 left beside P.
// The softmax moves each row's reference max lazily (online_softmax_lazy, slack 2^8), so on
// most tiles of a long prefix neither warpgroup rescales its 128 output registers.
// Warpgroup 0 issues Q K^T of tile j + 1 before P V of tile j, so the softmax of tile j + 1 runs
// while the tensor cores do P V (j). The warpgroups meet only at named barriers, each over all
// 256 threads (one warpgroup arrives, the other waits):
//   K_READY  wg1 -> wg0   tile j + 1 is in shared memory (wg1's cp.async waited, proxy-fenced)
//   P_READY  wg0 -> wg1   P(j) and its row factors are in shared memory
//   P_FREE   wg1 -> wg0   wg1's P V (j) is done: P(j + 1) may overwrite P(j)
//   K_FREE   wg0 -> wg1   wg0's P V (j - 1) is done: tile j + 3 may overwrite tile j - 1's stage
// Each barrier's arrivals alternate with its waits (checked in the notes beside each use), so
// no barrier ever sees a second round of arrivals before the wait of the first.
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

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
constexpr int P_B = BM * 128;          // P [64 rows][32 keys] bf16 in one swizzled column block (8192; half of each row used)
constexpr int ROWF_B = BM * 4;         // one float per query row
constexpr int STAGES = 4;
constexpr int NT = 256;
constexpr int WG = 128;
constexpr int KSTEPS = D / 16;         // k-steps of Q K^T (36)
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr float RESCALE_SLACK = 8.f;   // online_softmax_lazy: P <= 2^8, O rescaled only when a row's max moves more
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + P_B + 3 * ROWF_B;  // 230144: Q, stages, P, alpha / m / l
constexpr int SMEM_BYTES = SMEM_DATA + 1024;  // 231168 = specdiag.attention.native.smem_bytes(4, "wgmma_ws") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0 && P_B % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");
static_assert(BN * 2 <= 128, "a row of P fits one 128-byte swizzle row");

enum : int { BAR_K_READY = 1, BAR_K_FREE = 2, BAR_P_READY = 3, BAR_P_FREE = 4 };

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// where this thread's P values of 8-key group nt go: row r, keys 8 nt + 2 t4 and + 1 (4 bytes)
TVG_HD constexpr uint32_t p_offset(int r, int nt, int t4) { return (uint32_t)(r * 128 + ((nt ^ (r & 7)) << 4) + 4 * t4); }
// A operand of warpgroup 1's P V: keys 16 kk .. 16 kk + 15 of P, K-major
TVG_HD constexpr uint64_t p_desc(uint32_t p_base, int kk) { return kstep_desc(p_base, BM, kk); }
// B operand of warpgroup `wg`'s P V: keys 16 kk .., columns 256 wg ..
TVG_HD constexpr uint64_t v_desc(uint32_t tile_base, int wg, int kk) { return mn_desc(tile_base, BN, wg * (VH / 64), kk); }

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
  float* s_alpha = reinterpret_cast<float*>(smem + (sP - raw) + P_B);  // per row: factor for O before P V (j)
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

  if (n > 0) {
    load_rows<BM, NT>(sQ, tid, [&](int r, const __nv_bfloat16*& p, int& bytes) {
      const int gr = row0 + r;
      p = q + ((size_t)b * R + min(gr, R - 1)) * D;
      bytes = gr < R ? 16 : 0;
    });
    cp_async_commit();

    if (wg == 1) {
      // ------------------------------------------------ warpgroup 1: loads, O[:, 256:512]
      const int t = tid - WG;
      auto load_tile = [&](int tile) {
        load_rows<BN, WG>(stage(tile), t, [&](int r, const __nv_bfloat16*& p, int& bytes) {
          const int tok = (w.tile_begin + tile) * BN + r;
          const bool ok = tok < w.kv_len;
          const int tk = ok ? tok : 0;
          if (!w.is_tree) {
            const int page = __ldg(page_table + (size_t)b * max_pages + tk / page_size);
            p = kv_pool + ((size_t)page * page_size + (tk % page_size)) * D;
          } else {
            p = tree_kv + ((size_t)b * T + tk) * D;
          }
          bytes = ok ? 16 : 0;
        });
      };
      // cp.async groups: Q, tiles 0, 1, 2, then one per iteration (tile j + 3, or empty)
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) load_tile(s);
        cp_async_commit();
      }
      cp_async_wait<STAGES - 2>();  // Q and tile 0
      fence_proxy_async();
      __syncthreads();  // (1) Q and tile 0 visible to both warpgroups

      for (int j = 0; j < n; ++j) {
        bar_sync(BAR_P_READY, NT);  // wg0 arrived once per tile; it arrives again only after our P_FREE (j)
        const float alpha[2] = {s_alpha[wr + g], s_alpha[wr + g + 8]};
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) tvc::rescale_rows(o, alpha);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP, kk), v_desc(stage(j), 1, kk));
        wgmma_commit();
        if (j + 1 < n) {
          cp_async_wait<STAGES - 3>();  // our copies of tile j + 1 (tile j + 2's group may still be in flight)
          fence_proxy_async();
          bar_arrive(BAR_K_READY, NT);  // wg0 waits once per tile j + 1, and we arrive again only after P_READY (j + 1)
        }
        if (j + STAGES - 1 < n) {
          // tile j + 3 goes where tile j - 1 was: wait until wg0's P V (j - 1) is done (our own
          // finished last iteration). Tile 3's stage was never used. We wait before arriving
          // P_FREE (j), so wg0 cannot arrive K_FREE twice before this wait.
          if (j > 0) bar_sync(BAR_K_FREE, NT);
          load_tile(j + STAGES - 1);
        }
        cp_async_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        if (j + 1 < n) bar_arrive(BAR_P_FREE, NT);  // wg0 may overwrite P and the row factors
      }
      __syncthreads();  // (2) wg0 has left the final max and row sums in s_m / s_l
      m_r[0] = s_m[wr + g];
      m_r[1] = s_m[wr + g + 8];
      l_r[0] = s_l[wr + g];
      l_r[1] = s_l[wr + g + 8];
    } else {
      // ------------------------------------------------ warpgroup 0: scores, softmax, O[:, 0:256]
      cp_async_wait<0>();  // our share of Q
      fence_proxy_async();
      __syncthreads();  // (1)

      float s[16];
      uint32_t a[BN / 16][4], a_next[BN / 16][4];  // P of tile j (read by the running P V) and of j + 1
      float alpha[2];
      bool rescale = false;  // some row of this warp moved its reference max on the last softmax_tile
      auto issue_qk = [&](int tile) {
#pragma unroll
        for (int i = 0; i < 16; ++i) fence_operand(s[i]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) wgmma_qk(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(tile), BN, ks), ks > 0);
        wgmma_commit();
      };
      // S of `tile` (its Q K^T waited for) -> masked online softmax -> P in `p` (bf16 A fragments)
      // and in shared memory for wg1, with the row factors; arrives P_READY.
      auto softmax_tile = [&](int tile, uint32_t (&p)[BN / 16][4], bool wait_free) {
#pragma unroll
        for (int i = 0; i < 16; ++i) fence_operand(s[i]);
        tvc::mask_scores<BN>(s, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
        rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          p[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);  // row g, keys 16 kk + 2 t4 ..
          p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);  // row g + 8
          p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);  // row g, keys 16 kk + 8 + 2 t4 ..
          p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);  // row g + 8
        }
        if (wait_free) bar_sync(BAR_P_FREE, NT);  // wg1 is done with P (tile - 1)
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          st_shared_u32(sP + p_offset(wr + g, nt, t4), p[nt >> 1][(nt & 1) * 2]);
          st_shared_u32(sP + p_offset(wr + g + 8, nt, t4), p[nt >> 1][(nt & 1) * 2 + 1]);
        }
        if (t4 == 0) {
          s_alpha[wr + g] = alpha[0];
          s_alpha[wr + g + 8] = alpha[1];
        }
        fence_proxy_async();  // P is read by wg1's wgmma (async proxy)
        bar_arrive(BAR_P_READY, NT);
      };

      issue_qk(0);
      wgmma_wait<0>();
      softmax_tile(0, a, false);  // O is still zero: nothing to rescale
      using Frag = uint32_t[BN / 16][4];
      auto issue_pv = [&](int tile, const Frag& p) {  // O[:, 0:256] += P V (tile), P from registers (asynchronous)
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, p[kk], v_desc(stage(tile), 0, kk));
        wgmma_commit();
      };
      // One tile j < n - 1: P (j) is in `cur`, P (j + 1) goes to `nxt`. The loop runs it twice per
      // iteration with the register sets swapped (a copy nxt -> cur made ptxas serialise the
      // wgmma pipeline, C7513), and the last tile is peeled off: straight-line wgmma code.
      auto step = [&](int j, Frag& cur, Frag& nxt) {
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        bar_sync(BAR_K_READY, NT);  // tile j + 1 in shared memory
        issue_qk(j + 1);
        issue_pv(j, cur);
        wgmma_wait<1>();  // Q K^T (j + 1) done, P V (j) may still run
        softmax_tile(j + 1, nxt, true);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)  // P V (j) read these registers until the wait
#pragma unroll
          for (int i = 0; i < 4; ++i) fence_operand(cur[kk][i]);
        if (rescale) tvc::rescale_rows(o, alpha);
        // tile j's stage is free on our side: wg1 loads tile j + 4 there (it waits in its iteration j + 1)
        if (j + STAGES < n) bar_arrive(BAR_K_FREE, NT);
      };
      auto last = [&](const Frag& p) {
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
        wgmma_fence();
        issue_pv(n - 1, p);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) fence_operand(o[i]);
      };
      int j = 0;
      for (; j + 2 < n; j += 2) {
        step(j, a, a_next);
        step(j + 1, a_next, a);
      }
      if (j + 1 < n) {  // n even: P (n - 1) ends up in a_next
        step(j, a, a_next);
        last(a_next);
      } else {
        last(a);
      }
      tvc::quad_sum_rows(l_r);
      if (t4 == 0) {
        s_m[wr + g] = m_r[0];
        s_m[wr + g + 8] = m_r[1];
        s_l[wr + g] = l_r[0];
        s_l[wr + g + 8] = l_r[1];
      }
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
extern "C" __global__ void __launch_bounds__(tvws::NT, 1) tree_verify_partial_ws(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  tvws::verify_partial_ws(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H, page_size,
                          max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS, scale_log2);
}
#endif  // TVW_LAYOUT_ONLY
