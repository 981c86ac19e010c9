// Native MLA tree-verify attention (absorbed MLA, latent KV of 576 = 512 + 64 rope, V = first 512).
//
// One launch of `tree_verify_partial_rg{1,2,4}` computes partial attention for every
// (query tile, KV split, request):
//   * blockIdx.y <  n_prefix_splits: a contiguous range of the request's prefix, read
//     page by page with 16-byte cp.async loads (whole 1152-byte token rows, so any page
//     size, page_size=1 included, is read coalesced), no mask at all;
//   * blockIdx.y >= n_prefix_splits: a range of the tree block (the nodes' own latents)
//     under the ancestor mask.
// Queries of all tree nodes x heads are folded into the MMA M dimension (row r = node*H + head),
// so a batch-1 verify of 9 nodes x 8 heads is one 80-row problem, not 8 serial walks.
// Each CTA writes (O / l, lse) partials; `tree_verify_merge` combines them by log-sum-exp.
//
// Tensor cores: mma.sync m16n8k16 bf16 -> fp32. A CTA has RG row groups of 16 rows; each row
// group is a warp pair. Warp `half` 0/1 computes S over head dims [288*half, 288*half+288) and
// the pair sums its partial S through shared memory; for P.V warp `half` owns output columns
// [256*half, 256*half+256), so O (16 x 256 fp32) fits in 128 registers per thread.
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"

namespace tv {
using tvc::pack_bf16;

constexpr int D = 576;             // latent + rope
constexpr int DV = 512;            // value width
constexpr int DP = D + 8;          // padded shared-memory row: 1168 B, conflict-free ldmatrix
constexpr int BN = 32;             // keys per tile
constexpr int KH = D / 2;          // head dims per warp for Q.K^T
constexpr int VH = DV / 2;         // output columns per warp for P.V
constexpr int CHUNKS = D * 2 / 16; // 16-byte chunks per token row (72)
constexpr int STAGES = 3;          // cp.async pipeline depth

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

// c: 4 consecutive accumulators (c[0..3]) of a register array, indexed with constants only
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int RG>
__device__ __forceinline__ void verify_partial(
    const __nv_bfloat16* __restrict__ q,         // [B, R, D]
    const __nv_bfloat16* __restrict__ kv_pool,   // [P, page_size, D]
    const int* __restrict__ page_table,          // [B, max_pages]
    const int* __restrict__ prefix_lens,         // [B]
    const __nv_bfloat16* __restrict__ tree_kv,   // [B, T, D]
    const uint8_t* __restrict__ tree_mask,       // [B, T, T]
    float* __restrict__ o_part,                  // [B, NS, R, DV]
    float* __restrict__ lse_part,                // [B, NS, R]
    int R, int T, int H, int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split,
    int tree_tiles_per_split, int NS, float scale_log2) {
  constexpr int NW = 2 * RG;
  constexpr int NT = 32 * NW;
  constexpr int BM = 16 * RG;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sK = sQ + BM * DP;
  float* sS = reinterpret_cast<float*>(sK + STAGES * BN * DP);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp >> 1, half = warp & 1;
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);

  float o[VH / 2];  // 16 rows x 256 columns over the warp, accumulator order (tree_verify_common.cuh)
#pragma unroll
  for (int i = 0; i < VH / 2; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};

  if (w.n_tiles > 0) {
    const __nv_bfloat16* qb = q + (size_t)b * R * D;
    for (int i = tid; i < BM * CHUNKS; i += NT) {
      const int r = i / CHUNKS, c = i - r * CHUNKS;
      const int gr = row0 + r;
      cp_async16(sQ + r * DP + c * 8, qb + (size_t)min(gr, R - 1) * D + c * 8, gr < R ? 16 : 0);
    }
    // Warp w loads rows w, w + NW, ...: the page-table lookups of all its rows are issued
    // together (unrolled), then each row's 72 16-byte chunks go out as coalesced cp.async.
    auto load_tile = [&](int tile, int stage) {
      constexpr int ROWS_PER_WARP = BN / NW;
      __nv_bfloat16* dst = sK + stage * BN * DP;
      const int tok0 = (w.tile_begin + tile) * BN;
      const __nv_bfloat16* src[ROWS_PER_WARP];
      int bytes[ROWS_PER_WARP];
#pragma unroll
      for (int j = 0; j < ROWS_PER_WARP; ++j) {
        tvc::key_row<D>(w, tok0 + warp + j * NW, b, T, page_size, max_pages, page_table, kv_pool, tree_kv, src[j], bytes[j]);
      }
#pragma unroll
      for (int j = 0; j < ROWS_PER_WARP; ++j) {
        __nv_bfloat16* d = dst + (warp + j * NW) * DP;
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
      const __nv_bfloat16* kt = sK + (it % STAGES) * BN * DP;

      // ---- S = Q K^T over this warp's half of the head dims ----
      float s[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
#pragma unroll 6
      for (int ks = 0; ks < KH / 16; ++ks) {
        const int k0 = half * KH + ks * 16;
        uint32_t a[4];
        ldmatrix_x4(a, sQ + (qrow + (lane & 15)) * DP + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t bb[4];
          ldmatrix_x4(bb, kt + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * DP + k0 + ((lane >> 3) & 1) * 8);
          mma_bf16(&s[8 * np], a, bb[0], bb[1]);
          mma_bf16(&s[8 * np + 4], a, bb[2], bb[3]);
        }
      }
      // ---- the warp pair exchanges partial S through shared memory ----
      constexpr int SW = 16 * tvc::s_stride<BN>();  // floats per warp's exchange buffer
      tvc::store_partial_s<BN>(sS + warp * SW, s, g, t4);
      __syncthreads();
      tvc::combine_and_mask<BN>(s, sS + (warp ^ 1) * SW, g, t4, it, w, row0 + qrow, R, H, T, b, tree_mask, scale_log2);
      // ---- online softmax (log2 domain), two rows per thread: g and g + 8 ----
      float alpha[2];
      tvc::online_softmax<BN>(s, m_r, l_r, alpha);
      tvc::rescale_rows(o, alpha);
      // ---- O += P V over this warp's 256 output columns ----
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        a[1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        a[2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        a[3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
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

  // ---- epilogue: normalised partial output and its lse (natural log) ----
  tvc::write_partial(o, m_r, l_r, o_part, lse_part, b, NS, split, R, row0 + rg * 16, g, t4, half * VH, half == 0, DV);
}

}  // namespace tv

#define TV_INSTANTIATE(RG)                                                                                       \
  extern "C" __global__ void __launch_bounds__(64 * RG, 1) tree_verify_partial_rg##RG(                          \
      const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,      \
      const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T,     \
      int H, int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split,                    \
      int tree_tiles_per_split, int NS, float scale_log2) {                                                    \
    tv::verify_partial<RG>(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H, \
                           page_size, max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split,  \
                           NS, scale_log2);                                                                      \
  }

TV_INSTANTIATE(1)
TV_INSTANTIATE(2)
TV_INSTANTIATE(4)

// Merge the NS partials of every (request, row) by log-sum-exp. Grid (R, B, G), 128 threads:
// a CTA merges DV / G columns of one row; its threads form G split groups (group g takes splits
// g, g + G, ...), each thread 4 columns, and the groups meet in shared memory. The split weights
// exp(lse_s - max) are computed once per CTA into shared memory (up to MERGE_SMEM_SPLITS; more
// splits recompute them), and 8 partials per thread are loaded before any is used, so the loads
// overlap. G = 4 for many splits, 1 for few (the launcher picks). The first merge, one CTA per row
// whose every thread re-read all NS lse values and walked the splits one dependent step at a time,
// took 17-24 us for 72 rows x 65 splits: a third of the whole call at 32k.
constexpr int MERGE_THREADS = 128, MERGE_SMEM_SPLITS = 1024, MERGE_UNROLL = 8;

__device__ __forceinline__ float merge_block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by an earlier reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < MERGE_THREADS / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

extern "C" __global__ void __launch_bounds__(MERGE_THREADS) tree_verify_merge(const float* __restrict__ o_part,
                                                                              const float* __restrict__ lse_part,
                                                                              __nv_bfloat16* __restrict__ out,
                                                                              float* __restrict__ lse_out, int R, int NS) {
  __shared__ float weight[MERGE_SMEM_SPLITS];
  __shared__ float scratch[MERGE_THREADS / 32];
  __shared__ float4 part[MERGE_THREADS];
  const int G = gridDim.z;  // split groups: 1, 2 or 4 (the column block of a CTA is DV / G wide)
  const int lanes = MERGE_THREADS / G, r = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int group = tid / lanes, lane = tid % lanes;
  const float* lp = lse_part + (size_t)b * NS * R + r;
  float mx = -INFINITY;
  for (int s = tid; s < NS; s += MERGE_THREADS) mx = fmaxf(mx, lp[(size_t)s * R]);
  mx = merge_block_reduce(mx, true, scratch);
  float sum = 0.f;
  if (mx != -INFINITY) {
    for (int s = tid; s < NS; s += MERGE_THREADS) {
      const float w = __expf(lp[(size_t)s * R] - mx);
      if (s < MERGE_SMEM_SPLITS) weight[s] = w;
      sum += w;
    }
  }
  sum = merge_block_reduce(sum, false, scratch);  // its barriers also publish weight[]
  const int d = blockIdx.z * (tv::DV / G) + lane * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mx != -INFINITY) {
    const float* src = o_part + ((size_t)b * NS * R + r) * tv::DV + d;
    for (int s0 = group; s0 < NS; s0 += G * MERGE_UNROLL) {
      float4 v[MERGE_UNROLL];
      float w[MERGE_UNROLL];
#pragma unroll
      for (int u = 0; u < MERGE_UNROLL; ++u) {  // all loads first: they are in flight together
        const int s = s0 + u * G;
        w[u] = s >= NS ? 0.f : s < MERGE_SMEM_SPLITS ? weight[s] : __expf(lp[(size_t)s * R] - mx);
        v[u] = s < NS ? *reinterpret_cast<const float4*>(src + (size_t)s * R * tv::DV) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < MERGE_UNROLL; ++u) {
        if (w[u] == 0.f) continue;  // an empty split's partial may be unwritten: loaded, never used
        acc.x += w[u] * v[u].x;
        acc.y += w[u] * v[u].y;
        acc.z += w[u] * v[u].z;
        acc.w += w[u] * v[u].w;
      }
    }
  }
  if (G > 1) {
    part[tid] = acc;
    __syncthreads();
    if (group == 0) {
      for (int g = 1; g < G; ++g) {
        const float4 v = part[g * lanes + lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
    }
  }
  if (group == 0) {
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    __nv_bfloat16* dst = out + ((size_t)b * R + r) * tv::DV + d;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
  if (blockIdx.z == 0 && tid == 0) lse_out[(size_t)b * R + r] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}
