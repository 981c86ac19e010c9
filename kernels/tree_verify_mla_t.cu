// specdiag-arch: sm_90a
// Native MLA tree-verify attention for few query rows: the transposed products (v6, "wgmma_t").
//
// A wgmma's M is 64 rows. The other Hopper kernels put query rows in M, so a request of 72 rows
// (8 heads x 9 nodes) is two CTAs of 64 padded rows: 128 rows of MMA work for 72 useful ones,
// and at 32-185k those calls were bound by that padded work (1.5 us per 32-key tile and CTA).
// Here keys are M and query rows are N, which wgmma allows in steps of 8:
//   S^T [64 keys x NQ rows]  = K Q^T    (A = K tile, K-major; B = Q, K-major; 36 k-steps)
//   O^T [512 dims x NQ rows] += V^T P^T (A = V^T: the tile read MN-major; B = P^T from shared memory)
// With NQ = 40, 72 rows are two CTAs of 36 (80 rows of MMA work). Same contract, split-KV
// partials and LSE merge as the other kernels; tiles are 64 keys (one M), in 2 stages.
// Roles as in tree_verify_mla_ws.cu:
//   * warpgroup 0: S^T over all 576 dims, the mask and (lazy) online softmax, P^T into shared
//     memory, and O^T[0:256] += V^T P^T. A query row is a column of S^T, spread over the 4
//     warps: its max goes through shared memory (s_red) once per tile;
//   * warpgroup 1: every key-tile load (cp.async, tile j + 2 issued as soon as both warpgroups'
//     P V (j) is done) and O^T[256:512], each column rescaled by the factor warpgroup 0 left beside P^T.
// Warpgroup 0's step j issues P V (j) and (tile j + 1 in shared memory) S^T (j + 1), frees tile
// j's stage as soon as P V (j) is done (wg1 then loads tile j + 2 there) and runs the softmax of
// tile j + 1 once S^T is: a tile is in flight while the next one is computed. Named barriers, each over all
// 256 threads (one warpgroup arrives, the other waits); [x] = one per parity x of the tile:
//   K_READY     wg1 -> wg0   tile j + 1 is in shared memory (wg1's cp.async waited, proxy-fenced)
//   K_FREE      wg0 -> wg1   wg0's P V (j) is done: tile j + 2 may overwrite tile j's stage
//   P_READY[x]  wg0 -> wg1   P^T (t) and its column factors are in P buffer x = t % 2
//   P_FREE[x]   wg1 -> wg0   wg1's P V (t) is done: P^T (t + 2) may overwrite buffer x
// Each barrier's arrivals alternate with its waits (the notes beside each use say why).
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_wgmma.cuh"

namespace tvt {
using namespace tvg;
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 64;                 // keys per tile: the M of every wgmma
constexpr int NQ = 40;                 // query rows per CTA: the N of every wgmma
constexpr int NB = D / 64;             // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;  // 73728
constexpr int Q_B = NB * NQ * 128;     // 46080
constexpr int P_BUF = NQ * BN * 2;     // P^T as [NQ rows][64 keys] bf16, core-matrix layout (5120)
constexpr int P_B = 2 * P_BUF;
constexpr int STAGES = 2;
constexpr int NT = 256;
constexpr int WG = 128;
constexpr int KSTEPS = D / 16;         // k-steps of S^T (36)
constexpr int MB = DV / 64 / 2;        // 64-dim output blocks per warpgroup (4)
constexpr int NI = NQ / 8;             // 8-column groups of an accumulator (5)
constexpr int SV = NQ / 2;             // registers of one m64 x NQ accumulator (20)
constexpr int COLS = NQ / 4;           // query rows (columns) a thread holds (10)
// S^T's 36 k-steps accumulate into QK_CHAINS independent register sets (k-step ks into set
// ks % QK_CHAINS), added after the wait: one chain of 36 dependent wgmmas ran at ~83 cycles each
// on the H200 (clock64 in the kernel), the latency of a wgmma, not its throughput
constexpr int QK_CHAINS = 2;
constexpr float RESCALE_SLACK = 8.f;   // as tree_verify_mla_ws.cu: P <= 2^8, O rescaled only when a row's max moves more
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + P_B + 8 * NQ * 4;  // 205056: Q, stages, P x 2, alpha x 2, red x 4, m, l
constexpr int SMEM_BYTES = SMEM_DATA + 1024;  // 206080 = specdiag.attention.native.smem_bytes(4, "wgmma_t") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0 && (NQ * 128) % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");
static_assert(NQ % 8 == 0 && NQ <= 256, "wgmma N: a multiple of 8");

enum : int { BAR_K_READY = 1, BAR_K_FREE = 2, BAR_P_READY = 4, BAR_P_FREE = 6, BAR_WG0 = 8 };

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// P^T buffer, the K-major B operand of V^T P^T: query row n's keys in 8 x 16-byte core
// matrices, key chunk c (keys 8 c ..) of row n at (n / 8) * (BN * 16) + c * 128 + (n % 8) * 16
TVG_HD constexpr uint32_t pt_offset(int n, int key) {
  return (uint32_t)((n >> 3) * (BN * 16) + (key >> 3) * 128 + (n & 7) * 16 + (key & 7) * 2);
}
// B operand of V^T P^T: keys 16 kk .. 16 kk + 15, K-major, no swizzle
TVG_HD constexpr uint64_t pt_desc(uint32_t p_buf, int kk) { return make_desc_interleave(p_buf + kk * 256, 128, BN * 16); }
// A operand of warpgroup `wg`'s V^T P^T, output block mb (dims 256 wg + 64 mb ..): the tile's
// column block 4 wg + mb read MN-major (dims contiguous), keys 16 kk ..
TVG_HD constexpr uint64_t vt_desc(uint32_t tile_base, int wg, int mb, int kk) { return mn_desc(tile_base, BN, MB * wg + mb, kk); }
// Where Q's 16-byte chunk `chunk` of row r goes, for the CTA-wide load (NQ * 72 chunks, 256 threads)
TVG_HD constexpr uint32_t q_offset(int r, int chunk) { return tile_offset(NQ, r, chunk); }

// D[64 x NQ] (+)= A[64 x 16] B[16 x NQ], both from shared memory; TA = 1 reads A MN-major.
template <int TA>
__device__ __forceinline__ void wgmma_t(float (&d)[SV], uint64_t da, uint64_t db, int accumulate) {
  static_assert(SV == 20, "the asm below is m64n40k16");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %22, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, %20, %21, p, 1, 1, %23, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
      : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}

// Accumulator order (both products): entry 4 i + 2 h + c of a thread (warp w of its warpgroup,
// g = lane / 4, t4 = lane % 4) is M row 16 w + g + 8 h, N column 8 i + 2 t4 + c; the thread's
// column index is ci = 2 i + c.
TVG_HD constexpr int col_of(int ci, int t4) { return 8 * (ci >> 1) + 2 * t4 + (ci & 1); }

__device__ __forceinline__ void rescale_cols(float (&o)[MB][SV], const float (&alpha)[COLS]) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int i = 0; i < NI; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mb][4 * i + e] *= alpha[2 * i + (e & 1)];
}

__device__ __forceinline__ void verify_partial_t(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv_pool,
    const int* __restrict__ page_table, const int* __restrict__ prefix_lens,
    const __nv_bfloat16* __restrict__ tree_kv, const uint8_t* __restrict__ tree_mask,
    float* __restrict__ o_part, float* __restrict__ lse_part, int R, int T, int H, int page_size,
    int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t sQ = (raw + 1023u) & ~1023u;
  const uint32_t sK = sQ + Q_B;
  const uint32_t sP = sK + STAGES * TILE_B;
  float* s_alpha = reinterpret_cast<float*>(smem + (sP - raw) + P_B);  // [parity][column]: factor for O^T before P V (t)
  float* s_red = s_alpha + 2 * NQ;                                      // [warp][column]: per-warp column max / sum
  float* s_m = s_red + 4 * NQ;                                          // per column: final max and sum (epilogue)
  float* s_l = s_m + NQ;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, w4 = warp & 3;
  const int wr = w4 * 16;  // this warp's 16 M rows (keys of S^T, dims of an O^T block)
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * NQ;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);
  const int n = w.n_tiles;

  float o[MB][SV];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int i = 0; i < SV; ++i) o[mb][i] = 0.f;
  float m_c[COLS], l_c[COLS];  // per column: reference max (log2 units) and this thread's share of the sum
#pragma unroll
  for (int ci = 0; ci < COLS; ++ci) {
    m_c[ci] = -INFINITY;
    l_c[ci] = 0.f;
  }
  const auto stage = [&](int tile) { return sK + (tile % STAGES) * TILE_B; };
  auto fence_o = [&]() {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int i = 0; i < SV; ++i) fence_operand(o[mb][i]);
  };
  auto issue_pv = [&](int tile) {  // O^T[256 wg + ..] += V^T P^T (tile), P^T from its buffer (asynchronous)
    const uint32_t pbuf = sP + (tile & 1) * P_BUF;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) wgmma_t<1>(o[mb], vt_desc(stage(tile), wg, mb, kk), pt_desc(pbuf, kk), 1);
    wgmma_commit();
  };

  if (n > 0) {
    for (int idx = tid; idx < NQ * 72; idx += NT) {  // Q: row-major chunks, a quarter-warp per 128 bytes
      const int r = idx / 72, chunk = idx % 72, gr = row0 + r;
      cp_async16(sQ + q_offset(r, chunk), q + ((size_t)b * R + min(gr, R - 1)) * D + chunk * 8, gr < R ? 16 : 0);
    }
    cp_async_commit();

    if (wg == 1) {
      // ------------------------------------------------ warpgroup 1: loads, O^T[256:512]
      const int t = tid - WG;
      constexpr int ROWS_T = BN / (WG / 8);  // 4 rows of a tile per thread: t / 8 + 16 i
      auto pages_of = [&](int tile, int (&pg)[ROWS_T]) { tile_pages<BN, WG>(pg, w, (w.tile_begin + tile) * BN, t, b, page_size, max_pages, page_table); };
      auto load_tile = [&](int tile, const int (&pg)[ROWS_T]) {
        load_paged_tile<BN, WG, D>(stage(tile), pg, w, (w.tile_begin + tile) * BN, t, b, T, page_size, kv_pool, tree_kv);
      };
      int pg[ROWS_T];
      start_two_stages(n, pg, pages_of, load_tile);  // cp.async groups: Q, tiles 0, 1, then one per iteration (tile j + 2)
      __syncthreads();  // (1) Q and tile 0 visible to both warpgroups

      for (int j = 0; j < n; ++j) {
        // wg0 arrives P_READY[j % 2] again (tile j + 2) only after waiting for our P_FREE[j % 2] below
        bar_sync(BAR_P_READY + (j & 1), NT);
        float alpha[COLS];
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          const float2 a = *reinterpret_cast<const float2*>(&s_alpha[(j & 1) * NQ + 8 * i + 2 * t4]);
          alpha[2 * i] = a.x;
          alpha[2 * i + 1] = a.y;
        }
        bool any = false;
#pragma unroll
        for (int ci = 0; ci < COLS; ++ci) any |= alpha[ci] != 1.f;
        fence_o();
        if (__any_sync(0xffffffffu, any)) rescale_cols(o, alpha);
        wgmma_fence();
        issue_pv(j);
        if (j + 1 < n) {
          cp_async_wait<0>();  // tile j + 1 (issued last iteration, or before the loop)
          fence_proxy_async();
          bar_arrive(BAR_K_READY, NT);  // wg0 waits for it in step j, before it arrives P_READY (j + 1), our next wait
        }
        wgmma_wait<0>();
        fence_o();
        if (j + 2 < n) {
          // tile j + 2 goes where tile j was: wait for wg0's P V (j), which it signals before its
          // S^T (j + 1) is done. wg0 arrives K_FREE again (step j + 1) only after its K_READY
          // wait of step j + 1, which we arrive next iteration, after this wait
          bar_sync(BAR_K_FREE, NT);
          load_tile(j + 2, pg);
          if (j + 3 < n) pages_of(j + 3, pg);  // used next iteration
          cp_async_commit();
          bar_arrive(BAR_P_FREE + (j & 1), NT);  // our P V (j) is done: wg0 may write P^T (j + 2) there
        }
      }
      __syncthreads();  // (2) wg0 has left the final max and sums in s_m / s_l
    } else {
      // ------------------------------------------------ warpgroup 0: scores, softmax, O^T[0:256]
      cp_async_wait<0>();  // our share of Q
      fence_proxy_async();
      __syncthreads();  // (1)

      float sc[QK_CHAINS][SV];  // S^T in QK_CHAINS partial sums over interleaved k-steps
      float(&s)[SV] = sc[0];     // ... added into the first (sum_chains) for the softmax
      float alpha[COLS];
      bool rescale = false;
      auto fence_sc = [&]() {  // every chain's accumulators: none moves across the asynchronous Q K^T
#pragma unroll
        for (int c = 0; c < QK_CHAINS; ++c)
#pragma unroll
          for (int i = 0; i < SV; ++i) fence_operand(sc[c][i]);
      };
      auto issue_qk = [&](int tile) {  // S^T = K Q^T (tile) over all 576 dims (asynchronous)
        fence_sc();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
          wgmma_t<0>(sc[ks % QK_CHAINS], kstep_desc(stage(tile), BN, ks), kstep_desc(sQ, NQ, ks), ks >= QK_CHAINS);
        wgmma_commit();
      };
      auto sum_chains = [&]() {
        fence_sc();
#pragma unroll
        for (int c = 1; c < QK_CHAINS; ++c)
#pragma unroll
          for (int i = 0; i < SV; ++i) s[i] += sc[c][i];
      };
      // S^T of `tile` (waited for) -> masked online softmax per column -> P^T (bf16) and the
      // column factors into buffer tile % 2; arrives P_READY[tile % 2].
      auto softmax_tile = [&](int tile) {
#pragma unroll
        for (int i = 0; i < SV; ++i) fence_operand(s[i]);
        // scale, and mask where the tile reaches past the prefix or is in the tree
        if (!w.is_tree && (w.tile_begin + tile + 1) * BN <= w.kv_len) {
#pragma unroll
          for (int i = 0; i < SV; ++i) s[i] *= scale_log2;
        } else {
          const int tok0 = (w.tile_begin + tile) * BN + wr + g;
#pragma unroll
          for (int i = 0; i < NI; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int tok = tok0 + 8 * (e >> 1), grow = row0 + 8 * i + 2 * t4 + (e & 1);
              s[4 * i + e] = tvc::key_visible(tok, w, grow, R, H, T, b, tree_mask) ? s[4 * i + e] * scale_log2 : -INFINITY;
            }
        }
        // Does any column's max pass its reference by more than the slack? One barrier with an
        // OR over the warpgroup answers it; only then (the first tiles of a split, rarely after)
        // are the column maxima reduced: this thread's two keys, the 8 lanes of its t4
        // (shuffles), the 4 warps (s_red). Otherwise no reference moves, which is also what the
        // reduction would have found.
        bool need = false;
#pragma unroll
        for (int ci = 0; ci < COLS; ++ci) need |= fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]) > m_c[ci] + RESCALE_SLACK;
        need = bar_red_or(BAR_WG0, WG, need);  // also: every thread is past the previous tile's reads of s_red
        bool moved = false;
        if (need) {
          float mx[COLS];
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) {
            const int i = ci >> 1, c = ci & 1;
            float v = fmaxf(s[4 * i + c], s[4 * i + 2 + c]);
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
            mx[ci] = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          }
          if (g == 0)
#pragma unroll
            for (int ci = 0; ci < COLS; ++ci) s_red[w4 * NQ + col_of(ci, t4)] = mx[ci];
          bar_sync(BAR_WG0, WG);
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) {
            const int col = col_of(ci, t4);
            const float m4 = fmaxf(fmaxf(s_red[col], s_red[NQ + col]), fmaxf(s_red[2 * NQ + col], s_red[3 * NQ + col]));
            const bool move = m4 > m_c[ci] + RESCALE_SLACK;  // also when m_c is still -inf and the tile has a visible key
            const float m_new = move ? m4 : m_c[ci];
            alpha[ci] = move ? exp2f(m_c[ci] - (m_new == -INFINITY ? 0.f : m_new)) : 1.f;
            m_c[ci] = m_new;
            moved |= move;
          }
        } else {
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) alpha[ci] = 1.f;
        }
#pragma unroll
        for (int ci = 0; ci < COLS; ++ci) {
          const float m_use = m_c[ci] == -INFINITY ? 0.f : m_c[ci];
          const int i = ci >> 1, c = ci & 1;
          s[4 * i + c] = exp2f(s[4 * i + c] - m_use);
          s[4 * i + 2 + c] = exp2f(s[4 * i + 2 + c] - m_use);
          l_c[ci] = l_c[ci] * alpha[ci] + s[4 * i + c] + s[4 * i + 2 + c];
        }
        rescale = need && __any_sync(0xffffffffu, moved);  // every warp saw the same maxima: uniform over the warpgroup
        const int x = tile & 1;
        // wg1 is done with P^T (tile - 2), the last user of this buffer (our own P V (tile - 2)
        // was waited for in step tile - 2); wg1 arrives P_FREE[x] again only after P_READY[x]
        // (tile), which we arrive below
        if (tile >= 2) bar_sync(BAR_P_FREE + x, NT);
        const uint32_t buf = sP + x * P_BUF;
        // P^T[row][key] in key pairs: lanes g and g ^ 1 (keys k, k + 1) swap one value, so the
        // even one stores column 2 t4's pair and the odd one column 2 t4 + 1's
#pragma unroll
        for (int i = 0; i < NI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float v0 = s[4 * i + 2 * h], v1 = s[4 * i + 2 * h + 1];
            const float other = __shfl_xor_sync(0xffffffffu, (g & 1) ? v0 : v1, 4);
            const int key = wr + g + 8 * h, n0 = 8 * i + 2 * t4;
            if ((g & 1) == 0) st_shared_u32(buf + pt_offset(n0, key), pack_bf16(v0, other));
            else st_shared_u32(buf + pt_offset(n0 + 1, key - 1), pack_bf16(other, v1));
          }
        if (w4 == 0 && g == 0)
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) s_alpha[x * NQ + col_of(ci, t4)] = alpha[ci];
        fence_proxy_async();    // P^T is read by wgmma (async proxy)
        bar_sync(BAR_WG0, WG);  // ... by ours too: every warp's share in place
        bar_arrive(BAR_P_READY + x, NT);
      };

      issue_qk(0);
      wgmma_wait<0>();
      sum_chains();
      softmax_tile(0);  // O^T is still zero: nothing to rescale
      for (int j = 0; j + 1 < n; ++j) {
        fence_o();
        wgmma_fence();
        issue_pv(j);
        bar_sync(BAR_K_READY, NT);  // tile j + 1 in shared memory
        issue_qk(j + 1);            // the tensor cores interleave it with P V (j): separate registers
        wgmma_wait<1>();            // P V (j) done, S^T (j + 1) may run on
        fence_o();
        // tile j's stage is free on our side: wg1 loads tile j + 2 there (it waits in its
        // iteration j, after it arrived the K_READY we waited for); our next K_FREE (step j + 1)
        // comes after step j + 1's K_READY wait, which wg1 arrives after that wait
        if (j + 2 < n) bar_arrive(BAR_K_FREE, NT);
        wgmma_wait<0>();
        sum_chains();
        softmax_tile(j + 1);
        if (rescale) rescale_cols(o, alpha);
      }
      fence_o();
      wgmma_fence();
      issue_pv(n - 1);
      wgmma_wait<0>();
      fence_o();
      // whole column sums: the 8 lanes of a t4, then the 4 warps
#pragma unroll
      for (int ci = 0; ci < COLS; ++ci) {
        float l = l_c[ci];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l_c[ci] = l + __shfl_xor_sync(0xffffffffu, l, 16);
      }
      if (g == 0)
#pragma unroll
        for (int ci = 0; ci < COLS; ++ci) s_red[w4 * NQ + col_of(ci, t4)] = l_c[ci];
      bar_sync(BAR_WG0, WG);
      if (w4 == 0 && g == 0)
#pragma unroll
        for (int ci = 0; ci < COLS; ++ci) {
          const int col = col_of(ci, t4);
          s_m[col] = m_c[ci];
          s_l[col] = s_red[col] + s_red[NQ + col] + s_red[2 * NQ + col] + s_red[3 * NQ + col];
        }
      __syncthreads();  // (2)
    }
#pragma unroll
    for (int ci = 0; ci < COLS; ++ci) {
      m_c[ci] = s_m[col_of(ci, t4)];
      l_c[ci] = s_l[col_of(ci, t4)];
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: normalised partial O (rows = columns of O^T) and its lse (natural log);
  // an empty split writes O = 0 and lse = -inf ----
#pragma unroll
  for (int ci = 0; ci < COLS; ++ci) {
    const int col = col_of(ci, t4), grow = row0 + col;
    if (grow >= R) continue;
    const int i = ci >> 1, c = ci & 1;
    const float inv = l_c[ci] > 0.f ? 1.f / l_c[ci] : 0.f;
    float* dst = o_part + (((size_t)b * NS + split) * R + grow) * DV + wg * (DV / 2) + wr + g;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      dst[64 * mb] = o[mb][4 * i + c] * inv;
      dst[64 * mb + 8] = o[mb][4 * i + 2 + c] * inv;
    }
    if (wg == 0 && w4 == 0 && g == 0)
      lse_part[((size_t)b * NS + split) * R + grow] = l_c[ci] > 0.f ? (m_c[ci] + log2f(l_c[ci])) * 0.69314718055994531f : -INFINITY;
  }
}

}  // namespace tvt

#ifndef TVW_LAYOUT_ONLY
extern "C" __global__ void __launch_bounds__(tvt::NT, 1) tree_verify_partial_t40(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  tvt::verify_partial_t(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H, page_size,
                        max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS, scale_log2);
}
#endif  // TVW_LAYOUT_ONLY
