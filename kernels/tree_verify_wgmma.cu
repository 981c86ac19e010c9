// specdiag-arch: sm_90a
// Hopper tree-verify partial kernel for short prefixes: two symmetric warpgroups on 64 query rows,
// 32-key tiles in 3 cp.async stages (its fixed cost per CTA is lower than the seesaw kernel's).
//   * S = Q K^T: warpgroup h issues wgmma.m64n32k16 over head dims [288 h, +288), Q and K from
//     shared memory (K-major), and the two partial S are summed through shared memory;
//   * O += P V: warpgroup h owns output columns [256 h, +256): wgmma.m64n256k16 with P from
//     registers and V the same tile read MN-major (no second copy of V);
//   * Q K^T of tile j + 1 and P V of tile j run on the tensor cores while the warps exchange and
//     soft-max tile j + 1's scores.
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_sm90.cuh"

namespace tvw {
using namespace tvg;
using tv::D;
using tv::DV;

constexpr int BN = 32;                 // keys per tile
constexpr int BM = 64;                 // query rows per CTA
constexpr int CH = D * 2 / 16;         // 16-byte chunks per token row (72)
constexpr int NB = D / 64;             // column blocks of 64 head dims (9)
static_assert(NB * 8 == CH, "a column block is 8 chunks of 16 bytes");
constexpr int TILE_B = NB * BN * 128;  // 36864
constexpr int Q_B = NB * BM * 128;     // 73728
constexpr int STAGES = 3;
constexpr int NT = 256;
constexpr int KSTEPS = D / 16;         // k-steps of Q K^T (36), half of them per warpgroup
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr int SS = tvc::s_stride<BN>();

struct alignas(1024) Smem {  // the swizzle pattern is keyed to 1024-byte address bits
  uint8_t q[Q_B];
  uint8_t k[STAGES][TILE_B];
  float s[2][BM][SS];  // each warpgroup's partial S for the other
};
constexpr int SMEM_BYTES = sizeof(Smem) + 1024;  // + slack to align the dynamic base to 1024
constexpr int TREE_BITS = 0;  // masks from the mask bytes
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// cp.async assignment: thread `tid` copies chunks 8 c + tid % 8 (c = 0..8) of rows tid / 8 + 32 i
TVG_HD constexpr int load_row(int tid, int i) { return tvg::load_row<NT>(tid, i); }
// Q K^T k-step `ks` (head dims 288 half + 16 ks ..) of warpgroup `half` in a tile of `rows` rows
TVG_HD constexpr uint64_t qk_desc(uint32_t tile_base, int rows, int half, int ks) {
  return kstep_desc(tile_base, rows, half * (KSTEPS / 2) + ks);
}
// P V k-step `kk` (keys 16 kk ..) of warpgroup `half` (columns 256 half ..): V MN-major
TVG_HD constexpr uint64_t pv_desc(uint32_t tile_base, int half, int kk) { return mn_desc(tile_base, BN, half * (VH / 64), kk); }

__device__ __forceinline__ void verify_partial(const tv::VerifyParams& p) {
  Smem& sm = aligned_smem<Smem>();
  const uint32_t sQ = smem_u32(sm.q), sK = smem_u32(sm.k);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int half = warp >> 2;      // warpgroup
  const int wr = (warp & 3) * 16;  // this warp's 16 rows within the CTA's 64
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(p, split, b);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};

  if (w.n_tiles > 0) {
    load_q<BM, NT>(p, sQ, tid, b, row0);
    const auto stage = [&](int tile) { return sK + (tile % STAGES) * TILE_B; };
    auto load_tile = [&](int tile) {
      load_rows<BN, NT>(stage(tile), tid, [&](int r, const __nv_bfloat16*& src, int& bytes) {
        tvc::key_row(p, w, (w.tile_begin + tile) * BN + r, b, src, bytes);
      });
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < w.n_tiles) load_tile(s);
      cp_async_commit();
    }

    // The scores of one tile: the two warpgroups' partial sums exchanged through shared memory,
    // the mask, the online softmax; leaves P as the bf16 A fragments of P V and O's factor.
    // Contains a __syncthreads (all 256 threads call it).
    auto softmax_tile = [&](float (&s)[16], int tile, uint32_t (&a)[BN / 16][4], float (&alpha)[2]) {
      tvc::store_partial_s<BN>(&sm.s[half][wr][0], s, g, t4);
      __syncthreads();
      tvc::combine_and_mask<BN>(p, s, &sm.s[half ^ 1][wr][0], g, t4, tile, w, row0 + wr, b);
      tvc::online_softmax<BN>(s, m_r, l_r, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) tvc::pack_p(a[kk], s, kk);
    };
    auto issue_qk = [&](float (&s)[16], uint32_t kt) {
#pragma unroll
      for (int ks = 0; ks < KSTEPS / 2; ++ks) wgmma_qk(s, qk_desc(sQ, BM, half, ks), qk_desc(kt, BN, half, ks), ks > 0);
    };
    auto issue_pv = [&](const uint32_t (&a)[BN / 16][4], uint32_t kt) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, a[kk], pv_desc(kt, half, kk));
    };

    // Tile t is cp.async group t; tile j + 2 goes into the stage tile j - 1 used, once every warp
    // has finished P V of tile j - 1.
    float s[16];
    uint32_t a[BN / 16][4], a_next[BN / 16][4];  // P of tile j (read by the running P V) and of j + 1
    float alpha[2];
    cp_async_wait<STAGES - 2>();  // Q and tile 0
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
      cp_async_wait<0>();  // tile j + 1
      fence_proxy_async();
      __syncthreads();  // tile j + 1 visible; every warp is past P V (j - 1) and the last exchange
      if (j + 2 < w.n_tiles) load_tile(j + 2);
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
  tvc::write_partial(p, o, m_r, l_r, b, split, row0 + wr, g, t4, half * VH, half == 0);
}

}  // namespace tvw

#ifndef TV_LAYOUT_ONLY
TV_DEFINE_PARTIAL_KERNEL(tvw, tree_verify_partial_wgmma)
#endif  // TV_LAYOUT_ONLY
