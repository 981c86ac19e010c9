// Merge of the split partials by log-sum-exp: out[b][r] = sum_s w_s o_part[b][s][r] / sum_s w_s,
// w_s = exp(lse_s - max), and lse[b][r] = max + log(sum_s w_s).
//
// Grid (R, B, G), MERGE_THREADS threads: a CTA merges DV / G columns of one row; its threads form G
// split groups (group g takes splits g, g + G, ...), 4 columns each, and the groups meet in shared
// memory. The split weights are computed once per CTA into shared memory (up to MERGE_SMEM_SPLITS;
// past that they are recomputed), and MERGE_UNROLL partials per thread are loaded before any is
// used, so the loads overlap. The host picks G (specdiag.attention.plan.merge_groups).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_params.cuh"

namespace tvmerge {

constexpr int MERGE_THREADS = 128, MERGE_SMEM_SPLITS = 1024, MERGE_UNROLL = 8;

// max that keeps a NaN (fmaxf drops it): a NaN partial must reach the output, not be merged away.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? nan_max(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by an earlier reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < MERGE_THREADS / 32; ++w) v = is_max ? nan_max(v, scratch[w]) : v + scratch[w];
  return v;
}

__device__ __forceinline__ void merge(const tv::VerifyParams& p) {
  __shared__ float weight[MERGE_SMEM_SPLITS];
  __shared__ float scratch[MERGE_THREADS / 32];
  __shared__ float4 part[MERGE_THREADS];
  const int NS = p.NS, R = p.R;
  const int G = gridDim.z;  // split groups: 1, 2 or 4
  const int lanes = MERGE_THREADS / G, r = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int group = tid / lanes, lane = tid % lanes;
  const float* lp = p.lse_part + (size_t)b * NS * R + r;
  float mx = -INFINITY;
  for (int s = tid; s < NS; s += MERGE_THREADS) mx = nan_max(mx, lp[(size_t)s * R]);
  mx = block_reduce(mx, true, scratch);
  float sum = 0.f;
  if (mx != -INFINITY) {
    for (int s = tid; s < NS; s += MERGE_THREADS) {
      const float w = __expf(lp[(size_t)s * R] - mx);
      if (s < MERGE_SMEM_SPLITS) weight[s] = w;
      sum += w;
    }
  }
  sum = block_reduce(sum, false, scratch);  // its barriers also publish weight[]
  const int d = blockIdx.z * (tv::DV / G) + lane * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mx != -INFINITY) {
    const float* src = p.o_part + ((size_t)b * NS * R + r) * tv::DV + d;
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
    const float inv = sum == 0.f ? 0.f : 1.f / sum;
    __nv_bfloat16* dst = p.out + ((size_t)b * R + r) * tv::DV + d;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
  if (blockIdx.z == 0 && tid == 0) p.lse[(size_t)b * R + r] = sum == 0.f ? -INFINITY : mx + logf(sum);
}

}  // namespace tvmerge

TV_EXPORT_CONFIG(tvmerge::MERGE_THREADS, 1, 0, 0, 0)

extern "C" __global__ void __launch_bounds__(tvmerge::MERGE_THREADS) tree_verify_merge(const __grid_constant__ tv::VerifyParams p) {
  tvmerge::merge(p);
}
