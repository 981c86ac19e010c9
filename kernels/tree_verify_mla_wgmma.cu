// specdiag-arch: sm_90a
// Native MLA tree-verify attention, Hopper warpgroup-MMA (wgmma) version.
//
// Same contract, launch grid, split-KV partials and LSE merge as tree_verify_mla.cu (the merge
// kernel there combines this kernel's partials); what changes is how a CTA does its math:
//   * a CTA is two warpgroups (256 threads) on 64 query rows (rows = node * H + head);
//   * shared memory holds Q and each 32-key tile in the 128-byte-swizzled layout that both the
//     Tensor Memory Accelerator (TMA) writes and wgmma reads: the tile is 9 column blocks of 64
//     head dims; in a block, token row r is 128 contiguous bytes at r * 128 with its 16-byte
//     chunk c stored at chunk position c ^ (r % 8) (every block starts 1024-byte aligned);
//   * S = Q K^T: warpgroup h issues wgmma.m64n32k16 over head dims [288h, 288h + 288),
//     A = Q and B = K straight from shared memory (K-major, 128-byte swizzle), then the two
//     partial S are summed through shared memory (as the warp pairs of the mma.sync version do);
//   * O += P V: warpgroup h owns output columns [256h, 256h + 256): wgmma.m64n256k16 with
//     A = P from registers (the S accumulator layout is the A-fragment layout) and B = V,
//     the same shared-memory tile read MN-major (transposed): no second copy of V;
//   * key tiles, 3 stages, by 16-byte cp.async: each quarter-warp reads 128 contiguous bytes of
//     one token row and writes them to one 128-byte shared row (conflict-free); any page size.
//     Optionally (the host passes tensor maps: specdiag's tma=True; 0-7% slower on the H200),
//     where a tile is contiguous in memory (the tree block; a prefix whose page size is a
//     multiple of 32) thread 0 issues 9 TMA copies instead (one per column block, a box of 64
//     dims x 32 tokens) that complete on the stage's mbarrier. Q always uses cp.async.
//     Rows of a TMA tile past the end of the keys are zeroed in shared memory before use (the
//     pool's unused slots may hold anything; P = 0 there, but 0 * NaN is NaN).
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_wgmma.cuh"

namespace tvw {
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 32;                 // keys per tile
constexpr int BM = 64;                 // query rows per CTA
constexpr int CH = D * 2 / 16;         // 16-byte chunks per token row (72)
constexpr int NB = D / 64;             // column blocks of 64 head dims = one 128-byte swizzle row (9)
static_assert(NB * 8 == CH, "a column block is 8 chunks of 16 bytes");
constexpr int TILE_B = NB * BN * 128;  // 36864
constexpr int Q_B = NB * BM * 128;     // 73728
constexpr int STAGES = 3;
constexpr int NT = 256;
constexpr int KSTEPS = D / 16;         // k-steps of Q.K^T (36), half of them per warpgroup (288 dims)
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr int S_B = 2 * BM * tvc::s_stride<BN>() * 4;
constexpr int SMEM_DATA = Q_B + STAGES * TILE_B + S_B;  // 204800, then STAGES mbarriers
constexpr int SMEM_BYTES = SMEM_DATA + 64 + 1024;  // 205888 = specdiag.attention.native.smem_bytes(4, "wgmma") (+ slack to align the base to 1024)
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0 && (BN * 128) % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");

// ---- layout arithmetic (tree_verify_wgmma.cuh), host-callable so tests/cuda/wgmma_layout_check.cu can check it on a CPU ----
using tvg::tile_offset;
using tvg::make_desc;
// cp.async assignment: thread `tid` copies chunks 8 c + tid % 8 (c = 0..8) of rows tid / 8 + 32 i
TVG_HD constexpr int load_row(int tid, int i) { return tvg::load_row<NT>(tid, i); }
using tvg::load_chunk;
// Q.K^T k-step `ks` (head dims 288 half + 16 ks ..) of warpgroup `half` in a tile of `rows` rows
TVG_HD constexpr uint64_t qk_desc(uint32_t tile_base, int rows, int half, int ks) {
  return tvg::kstep_desc(tile_base, rows, half * (KSTEPS / 2) + ks);
}
// P.V k-step `kk` (keys 16kk..16kk+15) of warpgroup `half` (columns 256 half ..): V MN-major,
// four 64-column blocks BN * 128 bytes apart
TVG_HD constexpr uint64_t pv_desc(uint32_t tile_base, int half, int kk) { return tvg::mn_desc(tile_base, BN, half * (VH / 64), kk); }

using tvg::smem_u32;
using tvg::cp_async16;
using tvg::cp_async_commit;
using tvg::cp_async_wait;
using tvg::fence_proxy_async;
using tvg::st_shared_zero16;
using tvg::wgmma_fence;
using tvg::wgmma_commit;
using tvg::wgmma_wait;
using tvg::fence_operand;
using tvg::wgmma_qk;
using tvg::wgmma_pv;

// ---- mbarrier + TMA (cp.async.bulk.tensor), plain sm_90 ----
using tvg::mbar_init;
using tvg::mbar_fence_init;
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
using tvg::mbar_wait;
// box (64 dims, 1 column block, 32 tokens) at coordinates (0, block, token) of a 3-D map
// {64, 9, tokens} over 1152-byte token rows; completes `bar`'s transaction count
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int block, int token, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(block), "r"(token), "r"(bar) : "memory");
}

// ROWS (32 or 64) token rows into the swizzled layout at `dst` with cp.async by all NT threads
template <int ROWS, typename Src>
__device__ __forceinline__ void load_rows(uint32_t dst, Src src) { tvg::load_rows<ROWS, NT>(dst, threadIdx.x, src); }

__device__ __forceinline__ void verify_partial(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv_pool,
    const int* __restrict__ page_table, const int* __restrict__ prefix_lens,
    const __nv_bfloat16* __restrict__ tree_kv, const uint8_t* __restrict__ tree_mask,
    float* __restrict__ o_part, float* __restrict__ lse_part, int R, int T, int H, int page_size,
    int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2, const void* pool_map, const void* tree_map) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t sQ = (raw + 1023u) & ~1023u;  // the swizzle pattern is keyed to 1024-byte address bits
  const uint32_t sK = sQ + Q_B;
  float* sS = reinterpret_cast<float*>(smem + (sQ - raw) + Q_B + STAGES * TILE_B);
  const uint32_t bar0 = sQ + SMEM_DATA;  // STAGES mbarriers, 8 bytes each

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int half = warp >> 2;              // warpgroup
  const int wr = (warp & 3) * 16;          // this warp's 16 rows within the CTA's 64
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);
  const void* map = w.is_tree ? tree_map : pool_map;  // null: this part is loaded with cp.async
  const bool tma = map != nullptr;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};

  if (w.n_tiles > 0) {
    if (tma && tid == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) mbar_init(bar0 + 8 * s, 1);
      mbar_fence_init();
    }
    __syncthreads();
    tvg::load_q<BM, NT, D>(sQ, threadIdx.x, q, b, R, row0);
    // TMA: the token coordinate of a tile's first row (tree: rows of all requests back to back;
    // prefix: the pool as pages * page_size rows, a tile never straddles a page)
    auto tma_coord = [&](int tile) -> int {
      const int tok0 = (w.tile_begin + tile) * BN;
      if (w.is_tree) return b * T + tok0;
      if (tok0 >= w.kv_len) return 0;
      return __ldg(page_table + (size_t)b * max_pages + tok0 / page_size) * page_size + tok0 % page_size;
    };
    // tile -> stage: TMA from thread 0 (coord from tma_coord), else cp.async from every thread
    auto load_tile = [&](int tile, int stage, int coord) {
      const uint32_t dst = sK + stage * TILE_B;
      if (tma) {
        if (tid == 0) {
          const uint32_t bar = bar0 + 8 * stage;
          mbar_arrive_expect_tx(bar, TILE_B);
#pragma unroll
          for (int c = 0; c < NB; ++c) tma_load_3d(dst + c * BN * 128, map, c, coord, bar);
        }
        return;
      }
      load_rows<BN>(dst, [&](int r, const __nv_bfloat16*& p, int& bytes) {
        tvc::key_row<D>(w, (w.tile_begin + tile) * BN + r, b, T, page_size, max_pages, page_table, kv_pool, tree_kv, p, bytes);
      });
    };
    // TMA: wait for the tile's bytes, then zero its rows past the end of the keys (generic
    // stores: the caller's fence_proxy_async orders them before wgmma reads the tile)
    auto wait_tma_tile = [&](int tile) {
      const uint32_t stage = tile % STAGES;
      mbar_wait(bar0 + 8 * stage, (tile / STAGES) & 1);
      const int valid = w.kv_len - (w.tile_begin + tile) * BN;
      const int r = load_row(tid, 0);
      if (r >= valid) {
#pragma unroll
        for (int c = 0; c < NB; ++c) st_shared_zero16(sK + stage * TILE_B + tile_offset(BN, r, load_chunk(tid, c)));
      }
    };
    int coord_next = 0;  // TMA, thread 0: coordinate of the next tile to load (its page looked up a tile early)
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < w.n_tiles) load_tile(s, s, tma && tid == 0 ? tma_coord(s) : 0);
      cp_async_commit();
    }
    if (tma && tid == 0) coord_next = tma_coord(STAGES - 1);

    // S of one tile: the two warpgroups' partial sums exchanged through shared memory, the
    // mask, the online softmax; leaves P packed as the bf16 A fragments of P V and the factor
    // the running O must be scaled by. Contains a __syncthreads (all 256 threads call it).
    auto softmax_tile = [&](float (&s)[16], int tile, uint32_t (&a)[BN / 16][4], float (&alpha)[2]) {
      constexpr int SS = tvc::s_stride<BN>();
      tvc::store_partial_s<BN>(sS + (half * BM + wr) * SS, s, g, t4);
      __syncthreads();
      tvc::combine_and_mask<BN>(s, sS + ((half ^ 1) * BM + wr) * SS, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
      tvc::online_softmax<BN>(s, m_r, l_r, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    // S = Q K^T over this warpgroup's 288 head dims (asynchronous: the caller commits and waits)
    auto issue_qk = [&](float (&s)[16], uint32_t kt) {
#pragma unroll
      for (int ks = 0; ks < KSTEPS / 2; ++ks) wgmma_qk(s, qk_desc(sQ, BM, half, ks), qk_desc(kt, BN, half, ks), ks > 0);
    };
    // O += P V over this warpgroup's 256 output columns (asynchronous)
    auto issue_pv = [&](const uint32_t (&a)[BN / 16][4], uint32_t kt) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, a[kk], pv_desc(kt, half, kk));
    };
    const auto stage = [&](int tile) { return sK + (tile % STAGES) * TILE_B; };

    // Software pipeline (one CTA per SM, so the overlap has to come from inside the warpgroup):
    // while the tensor cores run Q K^T of tile j + 1 and then P V of tile j, the warps exchange
    // and soft-max tile j + 1's scores. Tile t is cp.async group t (empty when TMA loads it) or
    // the phase (t / 3) & 1 of mbarrier t % 3; tile j + 2 is loaded into the stage tile j - 1
    // used, once every warp has finished P V of tile j - 1.
    float s[16];
    uint32_t a[BN / 16][4], a_next[BN / 16][4];  // P of tile j (read by the running P V) and of j + 1
    float alpha[2];
    cp_async_wait<STAGES - 2>();  // Q and (cp.async) tile 0
    if (tma) wait_tma_tile(0);
    fence_proxy_async();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    wgmma_fence();
    issue_qk(s, stage(0));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    softmax_tile(s, 0, a, alpha);  // O is still zero: nothing to rescale

    for (int j = 0; j + 1 < w.n_tiles; ++j) {
      cp_async_wait<0>();  // tile j + 1 (cp.async)
      if (tma) wait_tma_tile(j + 1);
      fence_proxy_async();
      __syncthreads();     // tile j + 1 visible; every warp is past P V (j - 1) and the last exchange
      if (j + 2 < w.n_tiles) load_tile(j + 2, (j + 2) % STAGES, coord_next);
      if (tma && tid == 0) coord_next = tma_coord(j + 3);
      cp_async_commit();
#pragma unroll
      for (int i = 0; i < 16; ++i) fence_operand(s[i]);
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(o[i]);
      wgmma_fence();
      issue_qk(s, stage(j + 1));
      wgmma_commit();
      issue_pv(a, stage(j));
      wgmma_commit();
      wgmma_wait<1>();  // Q K^T (j + 1) done, P V (j) may still run
#pragma unroll
      for (int i = 0; i < 16; ++i) fence_operand(s[i]);
      softmax_tile(s, j + 1, a_next, alpha);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(o[i]);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)  // P V (j) read these registers until the wait
#pragma unroll
        for (int i = 0; i < 4; ++i) fence_operand(a[kk][i]);
      tvc::rescale_rows(o, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[kk][i] = a_next[kk][i];
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
    wgmma_fence();
    issue_pv(a, stage(w.n_tiles - 1));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  }
  cp_async_wait<0>();

  // ---- epilogue: normalised partial output and its lse (natural log) ----
  tvc::write_partial(o, m_r, l_r, o_part, lse_part, b, NS, split, R, row0 + wr, g, t4, half * VH, half == 0, DV);
}

}  // namespace tvw

#ifndef TVW_LAYOUT_ONLY
// pool_map / tree_map: device pointers to CUtensorMap (specdiag.tma) over the KV pool and the
// tree latents, or null to load that part with cp.async.
extern "C" __global__ void __launch_bounds__(tvw::NT, 1) tree_verify_partial_wgmma(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2, const void* pool_map, const void* tree_map) {
  tvw::verify_partial(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H, page_size,
                      max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS, scale_log2,
                      pool_map, tree_map);
}
#endif  // TVW_LAYOUT_ONLY
