// Portable tree-verify partial kernel: mma.sync m16n8k16 bf16 -> fp32, sm_80 and up.
//
// Grid (query tiles, splits, requests); a CTA takes 16 RG query rows (rows = node * H + head) over
// one split: a prefix range, read page by page as whole 1152-byte token rows with 16-byte
// cp.async (any page size), no mask; or a range of the tree block under the ancestor mask.
// RG row groups of 16 rows, each a warp pair: for Q K^T warp `half` covers head dims
// [288 half, +288) and the pair sums its partial S through shared memory; for P V it owns output
// columns [256 half, +256), so O (16 x 256 fp32) fits in 128 registers per thread.
// Variants (registry rows mma, mma_k16, mma_small) set TV_MMA_ROW_GROUPS and TV_MMA_KEYS, so that
// Smem fits each GPU's shared memory per CTA (registry.SMEM_PER_BLOCK).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"

#ifndef TV_MMA_ROW_GROUPS
#define TV_MMA_ROW_GROUPS 4
#endif
#ifndef TV_MMA_KEYS
#define TV_MMA_KEYS 32
#endif

namespace tvmma {
using tv::D;
using tv::DV;

constexpr int RG = TV_MMA_ROW_GROUPS;  // row groups of 16 query rows
constexpr int NW = 2 * RG;             // warps
constexpr int NT = 32 * NW;            // threads
constexpr int BM = 16 * RG;            // query rows per CTA
constexpr int BN = TV_MMA_KEYS;        // keys per tile
static_assert(BN % 16 == 0 && BN % NW == 0, "a tile is whole 16-key MMA steps, shared evenly by the warps");
constexpr int DP = D + 8;          // padded shared row (1168 B): conflict-free ldmatrix
constexpr int KH = D / 2;          // head dims per warp for Q K^T
constexpr int VH = DV / 2;         // output columns per warp for P V
constexpr int CHUNKS = D * 2 / 16; // 16-byte chunks per token row (72)
constexpr int STAGES = 3;          // cp.async pipeline depth
constexpr int SS = tvc::s_stride<BN>();

struct Smem {
  __nv_bfloat16 q[BM][DP];
  __nv_bfloat16 k[STAGES][BN][DP];
  float s[NW][16][SS];  // each warp's partial S for its partner
};
constexpr int SMEM_BYTES = sizeof(Smem);
constexpr int TREE_BITS = 0;  // masks from the mask bytes

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c: 4 consecutive accumulators of a register array (indexed with constants only)
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void verify_partial(const tv::VerifyParams& p) {
  extern __shared__ __align__(16) unsigned char smem[];
  Smem& sm = *reinterpret_cast<Smem*>(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp >> 1, half = warp & 1;
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(p, split, b);

  float o[VH / 2];  // 16 rows x 256 columns over the warp, accumulator order (tree_verify_common.cuh)
#pragma unroll
  for (int i = 0; i < VH / 2; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};

  if (w.n_tiles > 0) {
    const __nv_bfloat16* qb = p.q + (size_t)b * p.R * D;
    for (int i = tid; i < BM * CHUNKS; i += NT) {
      const int r = i / CHUNKS, c = i - r * CHUNKS;
      const int gr = row0 + r;
      cp_async16(&sm.q[r][c * 8], qb + (size_t)min(gr, p.R - 1) * D + c * 8, gr < p.R ? 16 : 0);
    }
    // Warp w loads rows w, w + NW, ...: the page-table lookups of all its rows are issued
    // together (unrolled), then each row's 72 16-byte chunks go out as coalesced cp.async.
    auto load_tile = [&](int tile, int stage) {
      constexpr int ROWS_PER_WARP = BN / NW;
      const int tok0 = (w.tile_begin + tile) * BN;
      const __nv_bfloat16* src[ROWS_PER_WARP];
      int bytes[ROWS_PER_WARP];
#pragma unroll
      for (int j = 0; j < ROWS_PER_WARP; ++j) tvc::key_row(p, w, tok0 + warp + j * NW, b, src[j], bytes[j]);
#pragma unroll
      for (int j = 0; j < ROWS_PER_WARP; ++j) {
        __nv_bfloat16* d = sm.k[stage][warp + j * NW];
#pragma unroll
        for (int c = lane; c < CHUNKS; c += 32) cp_async16(d + c * 8, src[j] + c * 8, bytes[j]);
      }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < w.n_tiles) load_tile(s, s);
      cp_async_commit();
    }

    const int qrow = rg * 16;
    for (int it = 0; it < w.n_tiles; ++it) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      {
        const int nxt = it + STAGES - 1;
        if (nxt < w.n_tiles) load_tile(nxt, nxt % STAGES);
        cp_async_commit();
      }
      const __nv_bfloat16* kt = &sm.k[it % STAGES][0][0];

      // S = Q K^T over this warp's half of the head dims
      float s[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
#pragma unroll 6
      for (int ks = 0; ks < KH / 16; ++ks) {
        const int k0 = half * KH + ks * 16;
        uint32_t a[4];
        ldmatrix_x4(a, &sm.q[qrow + (lane & 15)][k0 + (lane >> 4) * 8]);
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t bb[4];
          ldmatrix_x4(bb, kt + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * DP + k0 + ((lane >> 3) & 1) * 8);
          mma_bf16(&s[8 * np], a, bb[0], bb[1]);
          mma_bf16(&s[8 * np + 4], a, bb[2], bb[3]);
        }
      }
      // the warp pair exchanges partial S through shared memory
      tvc::store_partial_s<BN>(&sm.s[warp][0][0], s, g, t4);
      __syncthreads();
      tvc::combine_and_mask<BN>(p, s, &sm.s[warp ^ 1][0][0], g, t4, it, w, row0 + qrow, b);
      float alpha[2];
      tvc::online_softmax<BN>(s, m_r, l_r, alpha);
      tvc::rescale_rows(o, alpha);
      // O += P V over this warp's 256 output columns
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        tvc::pack_p(a, s, kk);
        const __nv_bfloat16* vrow = kt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + half * VH + (lane >> 4) * 8;
#pragma unroll
        for (int dp = 0; dp < VH / 16; ++dp) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, vrow + dp * 16);
          mma_bf16(&o[8 * dp], a, bb[0], bb[1]);
          mma_bf16(&o[8 * dp + 4], a, bb[2], bb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  tvc::write_partial(p, o, m_r, l_r, b, split, row0 + rg * 16, g, t4, half * VH, half == 0);
}

}  // namespace tvmma

TV_DEFINE_PARTIAL_KERNEL(tvmma, tree_verify_partial_mma)
