// The split partials' log-sum-exp merge, shared by the merge kernel (tree_verify_merge.cu) and the
// partial kernels' fused epilogue (TV_FUSED_MERGE=1: the last split CTA of a row tile merges it,
// counted in p.tile_done; no second launch).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_params.cuh"

#ifndef TV_FUSED_MERGE
#define TV_FUSED_MERGE 0
#endif

namespace tvmerge {

// max that keeps a NaN (fmaxf drops it): a NaN partial must reach the output, not be merged away.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }
// the merged row's lse (natural log) from the splits' max and weight sum; -inf for a row no key reached
__device__ __forceinline__ float merged_lse(float mx, float sum) { return sum == 0.f ? -INFINITY : mx + logf(sum); }
__device__ __forceinline__ float merged_inv(float sum) { return sum == 0.f ? 0.f : 1.f / sum; }

// named barrier BAR over THREADS threads; with _or: the OR of every thread's v
template <int BAR, int THREADS>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(THREADS) : "memory");
}
template <int BAR, int THREADS>
__device__ __forceinline__ bool bar_sync_or(bool v) {
  uint32_t out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(out)
      : "r"((uint32_t)v), "n"(BAR), "n"(THREADS)
      : "memory");
  return out != 0;
}

// Splits a fused merge takes (its weights fill ROWS x (splits + 1) floats of the caller's scratch;
// the host refuses more: specdiag.attention.native.FUSED_MERGE_MAX_SPLITS)
constexpr int FUSED_MERGE_MAX_SPLITS = 512;
template <int ROWS>
constexpr int fused_merge_scratch_floats() { return ROWS * (FUSED_MERGE_MAX_SPLITS + 1); }

// Rows row0 .. row0 + ROWS - 1 of request b merged by THREADS threads, `w` (shared memory,
// fused_merge_scratch_floats) holding each row's split weights and its 1 / sum: first every lse,
// then a thread per row its max, weights and lse, then each warp 4 of its rows at a time over
// the splits, lanes across the columns (every load a whole 512-byte run; 16 of them in flight a lane).
template <int THREADS, int ROWS, int BAR>
__device__ __forceinline__ void merge_tile(const tv::VerifyParams& p, int b, int row0, int tid, float* w) {
  constexpr int WARPS = THREADS / 32, GROUP = 4;
  static_assert(ROWS <= THREADS && ROWS % (WARPS * GROUP) == 0, "whole groups of rows per warp");
  const int NS = p.NS, R = p.R;
  if (NS > FUSED_MERGE_MAX_SPLITS) __trap();  // (the host refuses such a plan)
  float* inv = w + ROWS * NS;
  for (int i = tid; i < ROWS * NS; i += THREADS) {
    const int r = i / NS, s = i - r * NS;
    w[i] = row0 + r < R ? __ldcg(p.lse_part + ((size_t)b * NS + s) * R + row0 + r) : -INFINITY;
  }
  bar_sync<BAR, THREADS>();
  if (tid < ROWS) {
    float* wr = w + tid * NS;
    float mx = -INFINITY, sum = 0.f;
    for (int s = 0; s < NS; ++s) mx = nan_max(mx, wr[s]);
    for (int s = 0; s < NS; ++s) {
      wr[s] = mx == -INFINITY ? 0.f : __expf(wr[s] - mx);
      sum += wr[s];
    }
    inv[tid] = merged_inv(sum);
    if (row0 + tid < R) p.lse[(size_t)b * R + row0 + tid] = merged_lse(mx, sum);
  }
  bar_sync<BAR, THREADS>();
  const int warp = tid / 32, lane = tid % 32;
  for (int r0 = warp * GROUP; r0 < ROWS && row0 + r0 < R; r0 += WARPS * GROUP) {
    float4 acc[GROUP][4];
#pragma unroll
    for (int j = 0; j < GROUP; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < NS; ++s) {
      float4 v[GROUP][4];
#pragma unroll
      for (int j = 0; j < GROUP; ++j) {  // all loads first: they are in flight together
        const float* src = p.o_part + (((size_t)b * NS + s) * R + min(row0 + r0 + j, R - 1)) * tv::DV + 4 * lane;
#pragma unroll
        for (int c = 0; c < 4; ++c) v[j][c] = __ldcg(reinterpret_cast<const float4*>(src + 128 * c));
      }
#pragma unroll
      for (int j = 0; j < GROUP; ++j) {
        const float ws = w[(r0 + j) * NS + s];
        if (ws == 0.f) continue;  // an empty split's partial is never used
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc[j][c].x += ws * v[j][c].x;
          acc[j][c].y += ws * v[j][c].y;
          acc[j][c].z += ws * v[j][c].z;
          acc[j][c].w += ws * v[j][c].w;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      if (row0 + r0 + j >= R) break;
      const float f = inv[r0 + j];
      __nv_bfloat16* dst = p.out + ((size_t)b * R + row0 + r0 + j) * tv::DV + 4 * lane;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        *reinterpret_cast<__nv_bfloat162*>(dst + 128 * c) = __floats2bfloat162_rn(acc[j][c].x * f, acc[j][c].y * f);
        *reinterpret_cast<__nv_bfloat162*>(dst + 128 * c + 2) = __floats2bfloat162_rn(acc[j][c].z * f, acc[j][c].w * f);
      }
    }
  }
}

// TV_FUSED_MERGE=1, by the THREADS threads (tid 0 ..) that wrote this split CTA's partial rows,
// once all are written: the last of the row tile's NS split CTAs to count itself in p.tile_done
// merges the tile (merge_tile, `scratch` its shared memory) and sets the count back to 0 for the
// next call.
template <int THREADS, int ROWS, int BAR>
__device__ __forceinline__ void merge_if_last(const tv::VerifyParams& p, int b, int row0, int tid, float* scratch) {
  __threadfence();  // this thread's partial rows, device-wide, before the CTA counts itself
  bar_sync<BAR, THREADS>();
  bool last = false;
  if (tid == 0) {
    int* done = p.tile_done + (size_t)b * gridDim.x + blockIdx.x;
    last = atomicAdd(done, 1) == p.NS - 1;
    if (last) atomicExch(done, 0);
  }
  if (!bar_sync_or<BAR, THREADS>(last)) return;
  __threadfence();  // the other CTAs' rows, counted before ours, before we read them
  merge_tile<THREADS, ROWS, BAR>(p, b, row0, tid, scratch);
}

}  // namespace tvmerge

// A partial kernel module says whether its build merges in its epilogue (the host then launches no
// merge and keeps p.tile_done): kernels that never merge export 0 whatever the define.
#define TV_EXPORT_FUSED_MERGE(ON) extern "C" __device__ const int tv_fused_merge = (ON);
