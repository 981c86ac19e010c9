// specdiag-arch: sm_90a
// Hopper tree-verify partial kernel for few query rows: up to 72 (8 heads x 9 nodes) in one CTA,
// so a request reads each key once. Keys are the M of every wgmma, query rows its N:
//   S^T [64 keys x 72 rows]   = K Q^T    (A = the key tile, K-major; B = Q, one m64n72 chain)
//   O^T [512 dims x 72 rows] += V^T P^T  (A = the tile read MN-major; B = P^T, no swizzle)
//   * warpgroup 0: S^T part by part as the tile lands, the mask and the lazy online softmax, P^T,
//     O^T[0:256];
//   * warpgroup 1: Q's load, then O^T[256:512], rescaled by warpgroup 0's column factors;
//   * warpgroup 2: every tile's load (cp.async), in 3 parts of 3 column blocks.
// Q and two stages fill the 227 KB: P^T (t) goes where tile t's rope block was (only S^T (t)
// reads it) and a 1 KB tail; the column factors go through the CTA's own o_part rows (global,
// rewritten by the epilogue), the rare column-max reduction through the rope block; the epilogue
// passes each math warpgroup's half of O^T through Q's place or the stages.
// TV_SKIP (a -D bitmask of tvg::Skip) builds the stage ablations: results wrong by design.
// Named barriers (tvg::NamedBarrier; the ids of stage s = tile % 2 are the base + s). bar.sync and
// bar.red are .aligned: all threads waiting on one barrier's phase run the same instruction, the
// others arrive (compute-sanitizer's synccheck flags two waiting instructions: tests/cuda/racecheck_probe.cu)
//   kBarWideLanded + 3 s + part  loader -> wg0   that part of the stage's tile has landed (tile 0's
//                                             first part: also Q, wg1 -> wg0)
//   kBarWideFree + s             wg0, wg1 -> loader  both P V of the stage's tile are done
//   kBarWidePReady + s           wg0 -> wg1   P^T of the stage's tile, its factors and the flag "some
//                                             column's factor < 1" (global, beside the factors) are out
//   kBarWideWg0                  wg0 alone    the per-tile "any column moved" vote, P^T's stores,
//                                             the final sums, its epilogue's half of O^T in shared memory
//   kBarWideSums                 wg0 -> wg1   the final max and sums in Epilogue
//   kBarWideWg1                  wg1 alone    its epilogue's half of O^T in shared memory
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_sm90.cuh"

namespace tvwide {
using namespace tvg;
using tv::D;
using tv::DV;

constexpr int BN = 64;                          // keys per tile: the M of every wgmma
constexpr int NQ = 72;                          // query rows per CTA: the N of every wgmma
constexpr int BM = NQ;                          // (the launch shape's rows per CTA)
constexpr int NB = D / 64;                      // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;           // 73728
constexpr int ROPE_OFF = (NB - 1) * BN * 128;   // column block 8: where P^T starts
constexpr int PT_B = NQ * BN * 2;               // P^T [72 rows][64 keys] bf16 (9216)
constexpr int STAGE_B = ROPE_OFF + PT_B;        // the tile, then P^T's tail past the rope block
constexpr int Q_B = NB * NQ * 128;              // 82944
constexpr int STAGES = 2;
constexpr int WG = 128;
constexpr int NT = 3 * WG;                      // math warpgroups 0 and 1, loader 2
constexpr int PARTS = 3, PART_BLOCKS = NB / PARTS;  // a tile lands in 3 parts of 3 column blocks
constexpr int PART_KSTEPS = PART_BLOCKS * 4;    // S^T's k-steps over one part (12)
// threads on tile 0's first LANDED barrier: wg0 waits, the loader and wg1 (with Q) arrive
constexpr int LANDED0_N = 3 * WG;
// setmaxnreg moves registers within the CTA's allocation (ptxas' entry count for 384 threads,
// 168): warpgroup 0 holds S^T and half of O^T, warpgroup 1 half of O^T, the loader addresses
constexpr int ENTRY_REGS = (65536 / NT) & ~7;
constexpr int SOFTMAX_REGS = 256, PV_REGS = 176, LOAD_REGS = 72;
static_assert(SOFTMAX_REGS + PV_REGS + LOAD_REGS <= 3 * ENTRY_REGS, "setmaxnreg budget over the CTA's registers");
static_assert(PARTS * PART_BLOCKS == NB, "whole column blocks per part");
constexpr int KSTEPS = D / 16;                  // k-steps of S^T (36)
static_assert(PARTS * PART_KSTEPS == KSTEPS, "the parts' k-steps cover S^T");
constexpr int MB = DV / 64 / 2;                 // 64-dim output blocks per warpgroup (4)
constexpr int SV = NQ / 2;                      // registers of one m64 x 72 accumulator (36)
constexpr int COLS = NQ / 4;                    // query rows (columns) a thread holds (18)
// P <= 2^64: a column's reference moves only past it, so after a split's first tile O^T is
// rescaled almost never (the factors go through global memory, slow behind the loads); P, O^T
// and the sums stay far inside bf16 / float32 range
constexpr float RESCALE_SLACK = 64.f;
#ifndef TV_WIDE_WARM
#define TV_WIDE_WARM 1  // warpgroup 0 runs its softmax's code once while tile 0 lands
#endif
static_assert(STAGE_B >= TILE_B && STAGE_B % 1024 == 0 && Q_B % 1024 == 0, "swizzle atoms stay 1024-byte aligned");

struct alignas(1024) Smem {       // the swizzle pattern is keyed to 1024-byte address bits
  uint8_t q[Q_B];                 // Q [9 column blocks][72 rows][128 B]
  uint8_t stage[STAGES][STAGE_B];  // a key tile; once S^T is done, its rope block and the tail hold P^T
};
constexpr int SMEM_BYTES = sizeof(Smem);  // all of sm_90's 227 KB: no slack, the base must be aligned (exact_smem)
constexpr int TREE_BITS = 0;  // masks from the mask bytes
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");
// TV_TRACE=1: CTA (0, TV_TRACE_SPLIT, 0) records clock64() at each Event of its first TRACE_TILES
// tiles, per warpgroup (thread 0 of each), in tv_trace[who][tile][event] (specdiag.bench.trace.trace_wide)
#ifndef TV_TRACE_SPLIT
#define TV_TRACE_SPLIT 0
#endif
__device__ __forceinline__ bool traced_cta() { return (blockIdx.x | blockIdx.z) == 0 && blockIdx.y == TV_TRACE_SPLIT; }
enum Event : int {
  kTop = 0, kPart0 = 1, kQKIssued = 2, kQKDone = 3, kPOut = 4,  // wg0: step top, S^T's first part in, issued, done, P^T out
  kVoted = 5, kStored = 6, kFenced = 7,                         // wg0 in the softmax: past the vote, P^T stored, fenced
  kWaitP = 0, kGotP = 1, kPVIssued = 2, kPVDone = 3,            // wg1: before and after P_READY, P V issued, done
  kWaitFree = 0, kFree = 1, kIssued = 2, kLanded = 3,           // loader: before and after FREE, copies issued, landed
};
__device__ __forceinline__ void trace(int who, int t, Event e) {
  if (TV_TRACE && (unsigned)t < TRACE_TILES && traced_cta() && (threadIdx.x & 127) == 0) trace_clock(who, t, e);  // (tile -1: the warm run)
}
// row TRACE_TILES: each warpgroup's clock and global time (ns) at its start (slots 0, 1) and end
// (2, 3); the math warpgroups' clock at their last P V done (4) and past the sums' barrier (5);
// warpgroup 0's at the end of its warm run (6)
enum KernelEvent : int { kLastPV = 4, kSumsOut = 5, kWarmDone = 6 };
__device__ __forceinline__ void trace_kernel(int who, bool end) {
  if (TV_TRACE && traced_cta() && (threadIdx.x & 127) == 0) {
    trace_clock(who, TRACE_TILES, 2 * end);
    trace_ns(who, TRACE_TILES, 2 * end + 1);
  }
}
__device__ __forceinline__ void trace_kernel(int who, KernelEvent e) {
  if (TV_TRACE && traced_cta() && (threadIdx.x & 127) == 0) trace_clock(who, TRACE_TILES, e);
}

struct Epilogue {  // after the loop, in stage 0
  float red[4][NQ];  // per warp of warpgroup 0: column sums
  float m[NQ], l[NQ];
};
static_assert(sizeof(Epilogue) <= STAGE_B && 4 * NQ * 4 <= BN * 128, "scratch fits");
// the epilogue's half of O^T per math warpgroup, [72 columns][OUT_LD] floats (the pad puts a
// thread's 4 columns on 4 bank groups): warpgroup 0's in Q's place, 1's past Epilogue in the stages
constexpr int OUT_LD = DV / 2 + 4;
constexpr int OUT_B = NQ * OUT_LD * 4;
constexpr int EPILOGUE_B = 2048;
static_assert(sizeof(Epilogue) <= EPILOGUE_B && OUT_B <= Q_B && EPILOGUE_B + OUT_B <= STAGES * STAGE_B, "the epilogue fits");

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// P^T, the K-major B operand of V^T P^T: row n's keys in 8 x 16-byte core matrices, key chunk c
// (keys 8 c ..) of row n at (n / 8) * 1024 + c * 128 + (n % 8) * 16
TVG_HD constexpr uint32_t pt_buf(uint32_t stage_base) { return stage_base + ROPE_OFF; }
TVG_HD constexpr uint32_t pt_offset(int n, int key) {
  return (uint32_t)((n >> 3) * (BN * 16) + (key >> 3) * 128 + (n & 7) * 16 + (key & 7) * 2);
}
// where thread (g, t4) of the warp holding keys wr.. stores its pairs: this base plus
// pt_offset(8 i, 8 h) for columns 8 i + 2 t4 (+ 1), keys wr + g (+ 8 h); lanes g and g ^ 1 swap
// one value, so the even lane stores column 2 t4's key pair and the odd one column 2 t4 + 1's
TVG_HD constexpr uint32_t pt_thread(int wr, int g, int t4) { return pt_offset(2 * t4 + (g & 1), wr + g - (g & 1)); }
TVG_HD constexpr uint64_t pt_desc(uint32_t buf, int kk) { return make_desc_interleave(buf + kk * 256, 128, BN * 16); }
// A operand of warpgroup `wg`'s V^T P^T, output block mb (dims 256 wg + 64 mb ..), keys 16 kk ..
TVG_HD constexpr uint64_t vt_desc(uint32_t tile_base, int wg, int mb, int kk) { return mn_desc(tile_base, BN, MB * wg + mb, kk); }
// B operand of S^T (Q's 72 rows), k-step ks
TVG_HD constexpr uint64_t q_desc(uint32_t q_base, int ks) { return kstep_desc(q_base, NQ, ks); }
// the bytes between two k-steps of P^T, between two output blocks and two k-steps of V^T (desc_add)
constexpr uint32_t PT_KSTEP = 256, VT_BLOCK = BN * 128, VT_KSTEP = 16 * 128;
static_assert(pt_desc(0, 1) == desc_add(pt_desc(0, 0), PT_KSTEP) &&
                  vt_desc(0, 1, 1, 1) == desc_add(vt_desc(0, 1, 0, 0), VT_BLOCK + VT_KSTEP),
              "output-block and k-step strides");
// accumulator entry 4 i + 2 h + c: M row 16 w + g + 8 h, N column 8 i + 2 t4 + c; column index ci = 2 i + c
TVG_HD constexpr int col_of(int ci, int t4) { return 8 * (ci >> 1) + 2 * t4 + (ci & 1); }
// the node of query row `row` (clamped to R - 1) from the CTA's first node node0 = row0 / H and
// 1 / H: the row's offset from node0's first row is under 72 + H, where the float product is exact
// (18 integer divisions spilled)
TVG_HD int column_node(int row, int R, int H, int node0, float inv_h) {
  return node0 + (int)floorf(((row < R - 1 ? row : R - 1) - node0 * H + 0.5f) * inv_h);
}

__device__ __forceinline__ void verify_partial(const tv::VerifyParams& p) {
  Smem& sm = exact_smem<Smem>();
  const uint32_t sQ = smem_u32(sm.q), sK = smem_u32(sm.stage);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, w4 = warp & 3;
  const int wr = w4 * 16;  // this warp's 16 M rows (keys of S^T, dims of an O^T block)
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * NQ;
  const int split = blockIdx.y, b = blockIdx.z;
  const tvc::SplitWork w = tvc::split_work<BN>(p, split, b);
  const int n = w.n_tiles;
  const auto stage = [&](int tile) { return sK + (tile & 1) * STAGE_B; };
  const auto landed = [](int tile, int part) { return kBarWideLanded + 3 * (tile & 1) + part; };
  const auto freed = [](int tile) { return kBarWideFree + (tile & 1); };
  const auto p_ready = [](int tile) { return kBarWidePReady + (tile & 1); };
  static_assert(PARTS == 3, "three LANDED barriers per stage");

  trace_kernel(wg, false);
  if (wg == 2) {
    // ------------------------------------------------ warpgroup 2: every load
    setmaxnreg_dec<LOAD_REGS>();
    if (n > 0) {
      const KeyLoader<BN, WG> ld(p, w, tid - 2 * WG, b);
      using Pages = KeyLoader<BN, WG>::Pages;
      // tile `tile` in PARTS cp.async groups
      auto load_tile = [&](int tile, const Pages& k) {
#pragma unroll
        for (int part = 0; part < PARTS; ++part) {
          ld.copy<0, PART_BLOCKS>(stage(tile), tile, k, part * PART_BLOCKS);
          cp_async_commit();
        }
      };
      // each part of `tile` as this thread's copies of it land (`later` groups were issued after
      // the tile's): its LANDED barrier completes once all 128 loader threads have arrived
      auto announce = [&](int tile, auto later) { announce_parts<decltype(later)::value>(landed(tile, 0), 2 * WG); };
      Pages k;
      ld.pages(0, k);  // (warpgroup 1 loads Q meanwhile)
      trace(2, 0, kFree);
      load_tile(0, k);
      trace(2, 0, kIssued);
      if (n > 1) {
        ld.pages(1, k);
        trace(2, 1, kFree);
        load_tile(1, k);
        trace(2, 1, kIssued);
        announce_parts<PARTS>(landed(0, 0), 2 * WG, LANDED0_N);
        trace(2, 0, kLanded);
        announce(1, Const<0>{});
        trace(2, 1, kLanded);
      } else {
        announce_parts<0>(landed(0, 0), 2 * WG, LANDED0_N);
        trace(2, 0, kLanded);
      }
      // tile j + 2's page-table entries were read an iteration earlier, before the last tile's
      // copies landed: their latency is off the loader's loop
      Pages next;
      if (n > 2) ld.pages(2, next);
      for (int j = 0; j + 2 < n; ++j) {
        k = next;
        if (j + 3 < n) ld.pages(j + 3, next);
        trace(2, j + 2, kWaitFree);
        bar_sync(freed(j), NT);  // both math warpgroups are done with tile j: tile j + 2 goes there
        trace(2, j + 2, kFree);
        load_tile(j + 2, k);
        trace(2, j + 2, kIssued);
        announce(j + 2, Const<0>{});
        trace(2, j + 2, kLanded);
      }
    }
    trace_kernel(2, true);
    return;
  }

  // ------------------------------------------------ warpgroups 0 and 1: the math
  // (each its own instance: ptxas takes code after two setmaxnreg counts at the entry count)
  auto math = [&](auto role) {
    constexpr int C = decltype(role)::value;  // 0: S^T, softmax, O^T[0:256]; 1: O^T[256:512]
    // this CTA's rows of o_part: the column factors of tile parity x at [col][x], and whether any
    // column moved at [0][2 + x]
    float* const scratch = p.o_part + tvc::partial_row(p, b, split, row0) * DV;
    const int cols_here = min(NQ, p.R - row0);

    float o[MB][SV];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int i = 0; i < SV; ++i) o[mb][i] = 0.f;
    auto fence_o = [&]() {
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < SV; ++i) fence_operand(o[mb][i]);
    };
    auto rescale_col = [&](int ci, float a) {
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        o[mb][4 * (ci >> 1) + (ci & 1)] *= a;
        o[mb][4 * (ci >> 1) + 2 + (ci & 1)] *= a;
      }
    };
    // (the products' shared-memory bases pass through tvg::opaque: with them visible, nvcc hoists
    // every descriptor out of the loop and spills them)
    auto issue_pv = [&](int tile) {  // O^T[256 C ..] += V^T P^T (tile), asynchronous
      const uint32_t base = opaque(stage(tile));
      const uint64_t dv = vt_desc(base, C, 0, 0), dp = pt_desc(pt_buf(base), 0);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
          if constexpr (runs(kSkipPV)) wgmma_t72(o[mb], desc_add(dv, VT_BLOCK * mb + VT_KSTEP * kk), desc_add(dp, PT_KSTEP * kk), 1);
      wgmma_commit();
    };

    if (n > 0) {
      if constexpr (C == 1) {
        // ------------------------------------------------ warpgroup 1: O^T[256:512]
        // Q first (idle until P^T (0), so the loader starts on tile 0 at once), announced with
        // tile 0's first part
        for (int idx = tid - WG; idx < NQ * 72; idx += WG) {
          const int r = idx / 72, chunk = idx % 72, gr = row0 + r;
          cp_async16(sQ + tile_offset(NQ, r, chunk), p.q + ((size_t)b * p.R + min(gr, p.R - 1)) * D + chunk * 8, gr < p.R ? 16 : 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        bar_arrive(landed(0, 0), LANDED0_N);
        for (int j = 0; j < n; ++j) {
          // past P_READY, wg0's flag says whether some column's reference moved (factor < 1): only
          // then the factors' global reads
          trace(1, j, kWaitP);
          bar_sync(p_ready(j), 2 * WG);
          const bool rescale = scratch[2 + (j & 1)] != 0.f;
          trace(1, j, kGotP);
          fence_proxy_async();  // (the tile reached us through wg0's barriers)
          if (rescale) {
            fence_o();
#pragma unroll
            for (int ci = 0; ci < COLS; ++ci) {
              const int col = col_of(ci, t4);
              if (col < cols_here) rescale_col(ci, scratch[(size_t)col * DV + (j & 1)]);
            }
          }
          fence_o();
          wgmma_fence();
          issue_pv(j);
          trace(1, j, kPVIssued);
          wgmma_wait<0>();
          trace(1, j, kPVDone);
          fence_o();
          if (j + 2 < n) bar_arrive(freed(j), NT);
        }
        trace_kernel(1, kLastPV);
      } else {
        // ------------------------------------------------ warpgroup 0: scores, softmax, O^T[0:256]
        float s[SV];  // S^T, one m64 x 72 accumulator (entries in the order of tvwide::col_of)
        // each column's reference max (log2 units), held once per t4 across its 8 lanes: column
        // index ci in md[ci / 8] of lane g = ci % 8 (18 registers would spill)
        float md[3];
        // this thread's share of the column sums: column index 2 i + g % 2 in lh[i], over the key
        // pair P^T's lane-pair swap gives it (18 registers would spill)
        float lh[COLS / 2];
        auto clear_columns = [&]() {  // no reference max, no sum yet
#pragma unroll
          for (int i = 0; i < 3; ++i) md[i] = -INFINITY;
#pragma unroll
          for (int i = 0; i < COLS / 2; ++i) lh[i] = 0.f;
        };
        clear_columns();
        auto m_of = [&](int ci) { return __shfl_sync(0xffffffffu, md[ci >> 3], (ci & 7) * 4 + t4); };
        auto fence_s = [&]() {
#pragma unroll
          for (int i = 0; i < SV; ++i) fence_operand(s[i]);
        };
        // S^T = K Q^T (tile) over all 576 dims in one chain (two chains of 40 and 32 columns read
        // the key tile twice), each part of the tile as it lands
        auto issue_qk = [&](int tile) {
          const uint32_t kb = opaque(stage(tile)), qb = opaque(sQ);
          const uint64_t dk = kstep_desc(kb, BN, 0), dq = q_desc(qb, 0);
          fence_s();
          wgmma_fence();
#pragma unroll
          for (int part = 0; part < PARTS; ++part) {
            bar_sync(landed(tile, part), tile == 0 && part == 0 ? LANDED0_N : 2 * WG);
            if (part == 0) trace(0, tile, kPart0);
#pragma unroll
            for (int ks = part * PART_KSTEPS; ks < (part + 1) * PART_KSTEPS; ++ks) {
              if constexpr (runs(kSkipQK)) wgmma_t72<0>(s, desc_add(dk, kstep_offset(BN, ks)), desc_add(dq, kstep_offset(NQ, ks)), ks > 0);
            }
          }
          wgmma_commit();
          trace(0, tile, kQKIssued);
        };
        // S^T of `tile` (waited for) -> masked lazy online softmax per column -> P^T (bf16) where the
        // tile's rope block was, the column factors in global (past a split's first tile, when one
        // moved) and the "moved" flag, then P_READY (tile % 2). Tile -1, the warm run: tile 0's
        // instructions with no shared-memory stores, no factor and no P_READY, to fetch them early
        auto softmax_tile = [&](int tile) {
          const bool warm = tile < 0;
          if constexpr (!runs(kSkipSoftmax)) {
            if (tid == 0 && !warm) scratch[2 + (tile & 1)] = 0.f;  // (no factors for warpgroup 1)
            fence_proxy_async();
            if (!warm) bar_arrive(p_ready(tile), 2 * WG);
            return;
          }
          fence_s();
          if (!runs(kSkipMask) || (!w.is_tree && (w.tile_begin + max(tile, 0) + 1) * BN <= w.kv_len)) {
#pragma unroll
            for (int i = 0; i < SV; ++i) s[i] *= p.scale_log2;
          } else {
            // this thread's keys g and g + 8 (entries 4 i + 2 h + c of column 2 i + c), past the
            // part's end masked; in the tree also by each column's row of the ancestor mask, both
            // keys' bytes loaded unconditionally and the scores selected, not branched on (a
            // branch per load serialised their latencies)
            const int tok0 = (w.tile_begin + max(tile, 0)) * BN + wr + g;
            if (!w.is_tree) {
#pragma unroll
              for (int e = 0; e < SV; ++e) {
                const float v = s[e] * p.scale_log2;
                s[e] = tok0 + 8 * ((e >> 1) & 1) < w.kv_len ? v : -INFINITY;
              }
            } else {
              const int node0 = row0 / p.H;
              const float inv_h = 1.f / p.H;
#pragma unroll
              for (int ci = 0; ci < COLS; ++ci) {
                const int node = column_node(row0 + col_of(ci, t4), p.R, p.H, node0, inv_h);
                const uint8_t* mrow = p.tree_mask + ((size_t)b * p.T + node) * p.T;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const int tok = tok0 + 8 * h, e = 4 * (ci >> 1) + 2 * h + (ci & 1);
                  const bool in = tok < w.kv_len;
                  const bool vis = in & (__ldg(mrow + (in ? tok : 0)) != 0);
                  const float v = s[e] * p.scale_log2;
                  s[e] = vis ? v : -INFINITY;
                }
              }
            }
          }
          // Does any column's max pass its reference by more than the slack? One vote over the
          // warpgroup; only then are the column maxima reduced (shuffles over the 8 lanes of a t4,
          // the 4 warps through the rope block, which S^T no longer reads)
          bool need = false;
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) {
            const float v = fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]);
            need |= v > m_of(ci) + RESCALE_SLACK;
          }
          need = __any_sync(0xffffffffu, bar_red_or(kBarWideWg0, WG, need));  // (a vote: nvcc sees it warp-uniform)
          trace(0, tile, kVoted);
          bool moved = false;
          const uint32_t buf = pt_buf(stage(tile));
          float* red = reinterpret_cast<float*>(sm.stage[tile & 1] + ROPE_OFF);  // [warp][column]
          const uint32_t red_s = smem_u32(red);
          if (need) {
#pragma unroll
            for (int ci = 0; ci < COLS; ++ci) {
              float v = fmaxf(s[4 * (ci >> 1) + (ci & 1)], s[4 * (ci >> 1) + 2 + (ci & 1)]);
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
              if (g == 0 && !warm) red[w4 * NQ + col_of(ci, t4)] = v;
            }
            bar_sync(kBarWideWg0, WG);
            float2 r4[4];
#pragma unroll
            for (int ci = 0; ci < COLS; ++ci) {
              const int col = col_of(ci, t4);
              // the 4 warps' maxima of columns col and col + 1, read at even ci (none in the warm run:
              // tile 1 is landing there)
              if ((ci & 1) == 0)
#pragma unroll
                for (int w = 0; w < 4; ++w) r4[w] = ld_shared_f2_if(red_s + (w * NQ + col) * 4, !warm);
              const float m4 = (ci & 1) ? fmaxf(fmaxf(r4[0].y, r4[1].y), fmaxf(r4[2].y, r4[3].y))
                                        : fmaxf(fmaxf(r4[0].x, r4[1].x), fmaxf(r4[2].x, r4[3].x));
              const float m_old = m_of(ci);
              const bool move = m4 > m_old + RESCALE_SLACK;  // also when m_old is still -inf and the tile has a visible key
              const float m_new = move ? m4 : m_old;
              const float a = move ? exp2f(m_old - (m_new == -INFINITY ? 0.f : m_new)) : 1.f;
              if (g == (ci & 7)) md[ci >> 3] = m_new;
              moved |= move;
              if ((ci & 1) == (g & 1)) lh[ci >> 1] *= a;
              rescale_col(ci, a);  // O^T is idle: P V (tile - 1) was waited for
              if (tile > 0 && w4 == 0 && g == 0 && col < cols_here) scratch[(size_t)col * DV + (tile & 1)] = a;
            }
            bar_sync(kBarWideWg0, WG);  // every warp has read the maxima before P^T overwrites them
          }
          // (every warp saw the same maxima; on the first tile O^T is still zero)
          const bool rescale = tile > 0 && need && __any_sync(0xffffffffu, moved);
          if (tid == 0 && !warm) scratch[2 + (tile & 1)] = rescale ? 1.f : 0.f;
#pragma unroll
          for (int ci = 0; ci < COLS; ++ci) {
            const float m_ref = m_of(ci), m_use = m_ref == -INFINITY ? 0.f : m_ref;
            const int i = ci >> 1, c = ci & 1;
            s[4 * i + c] = tvc::score_exp2<true>(s[4 * i + c] - m_use);
            s[4 * i + 2 + c] = tvc::score_exp2<true>(s[4 * i + 2 + c] - m_use);
          }
          // P^T[row][key] in key pairs (pt_thread), from one address plus immediates, the values
          // selected and the stores predicated: no branch between a swap and its store, so the 18
          // swaps overlap (with a branch per store, each waited for its swap)
          const int odd = g & 1;
          const uint32_t pt_mine = buf + pt_thread(wr, g, t4);
#pragma unroll
          for (int i = 0; i < SV / 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float v0 = s[4 * i + 2 * h], v1 = s[4 * i + 2 * h + 1];
              const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
              const float lo = odd ? other : v0, hi = odd ? v1 : other;
              st_shared_u32_if(pt_mine + pt_offset(8 * i, 8 * h), tvc::pack_bf16(lo, hi), !warm);
              lh[i] += lo + hi;
            }
          trace(0, tile, kStored);
          fence_proxy_async();  // P^T is read by wgmma (async proxy), by both warpgroups
          trace(0, tile, kFenced);
          if (!warm) bar_arrive(p_ready(tile), 2 * WG);  // every warp's share of P^T is in place
          trace(0, tile, kPOut);
        };

        // softmax_tile is inlined once, inside the loop; with TV_WIDE_WARM its first run (j = -2)
        // only fetches that code, while tile 0 lands (run cold, tile 0's softmax held the stream up)
#pragma unroll
        for (int i = 0; i < SV; ++i) s[i] = 0.f;
        trace(0, 0, kTop);
        // (the start is opaque: a known first iteration is peeled off, a second copy of the code)
#pragma unroll 1
        for (int j = (int)opaque((uint32_t)(TV_WIDE_WARM ? -2 : -1)); j + 1 < n; ++j) {
          if (j == -1) {
            issue_qk(0);
            wgmma_wait<0>();
          } else if (j >= 0) {
            fence_o();
            wgmma_fence();
            trace(0, j + 1, kTop);
            issue_pv(j);
            issue_qk(j + 1);  // the tensor cores interleave it with P V (j): separate registers
            wgmma_wait<1>();  // P V (j) done, S^T (j + 1) may run on
            fence_o();
            if (j + 2 < n) bar_arrive(freed(j), NT);  // the loader puts tile j + 2 there once wg1 is done too
            wgmma_wait<0>();
          }
          trace(0, j + 1, kQKDone);
          softmax_tile(j + 1);
          if (j == -2) {
            clear_columns();  // (the warm run read garbage maxima; from -inf, its factors were 0 or 1)
            trace_kernel(0, kWarmDone);
          }
        }
        fence_o();
        wgmma_fence();
        issue_pv(n - 1);
        wgmma_wait<0>();
        fence_o();
        trace_kernel(0, kLastPV);
        // whole column sums: the 4 lanes of a t4 and key parity, then the 4 warps (in stage 0's column
        // block 0: every load has landed, and only our P V read it)
        Epilogue& ep = *reinterpret_cast<Epilogue*>(sm.stage[0]);
#pragma unroll
        for (int i = 0; i < COLS / 2; ++i) {
          float l = lh[i];
          l += __shfl_xor_sync(0xffffffffu, l, 8);
          l += __shfl_xor_sync(0xffffffffu, l, 16);
          if (g < 2) ep.red[w4][col_of(2 * i + g, t4)] = l;
        }
        bar_sync(kBarWideWg0, WG);
        // a column's sum by one thread; its max by the lane of warp 0 that holds it (md[ci / 8] of g = ci % 8)
        if (tid < NQ) ep.l[tid] = ep.red[0][tid] + ep.red[1][tid] + ep.red[2][tid] + ep.red[3][tid];
#pragma unroll
        for (int k = 0; k < 3; ++k)
          if (w4 == 0 && 8 * k + g < COLS) ep.m[col_of(8 * k + g, t4)] = md[k];
        bar_sync(kBarWideWg0, WG);  // (warp 0 wrote them: the other three read them too)
      }
      // wg0 has left the final max and sums in Epilogue
      if (C == 0) bar_arrive(kBarWideSums, 2 * WG);
      else bar_sync(kBarWideSums, 2 * WG);
      trace_kernel(C, kSumsOut);
    }
    const Epilogue& ep = *reinterpret_cast<const Epilogue*>(sm.stage[0]);

    // ---- epilogue: this warpgroup's half of O^T into shared memory, then each warp writes whole
    // columns (o_part rows) normalised, 16 bytes a lane; an empty split writes O = 0 and lse = -inf,
    // a NaN sum stays NaN. (Its code runs once, cold: the stores are few and the loop rolled.) ----
    float* const out = reinterpret_cast<float*>(C == 0 ? sm.q : sm.stage[0] + EPILOGUE_B);
    {
      float* const mine = out + 2 * t4 * OUT_LD + wr + g;
#pragma unroll
      for (int ci = 0; ci < COLS; ++ci)
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
          const int i = ci >> 1, c = ci & 1;
          mine[(8 * i + c) * OUT_LD + 64 * mb] = o[mb][4 * i + c];
          mine[(8 * i + c) * OUT_LD + 64 * mb + 8] = o[mb][4 * i + 2 + c];
        }
    }
    // each column's 1 / sum in its row's pad and (warpgroup 0) its lse, one thread a column, so that
    // the loop below has no chain of its own per column (the warp and lane anew: kept from the
    // kernel's start, the warp index went to local memory)
    const int etid = (int)opaque((uint32_t)tid), ew4 = (etid >> 5) & 3, elane = etid & 31, ecol = etid & (WG - 1);
    if (ecol < cols_here) {
      const float l = n > 0 ? ep.l[ecol] : 0.f;  // per column: sum and max (log2 units)
      out[ecol * OUT_LD + DV / 2] = tvc::inv_sum(l);
      if (C == 0) p.lse_part[tvc::partial_row(p, b, split, row0) + ecol] = tvc::partial_lse(n > 0 ? ep.m[ecol] : 0.f, l);
    }
    bar_sync(C == 0 ? kBarWideWg0 : kBarWideWg1, WG);
#pragma unroll 3
    for (int col = ew4; col < cols_here; col += 4) {
      const float inv = out[col * OUT_LD + DV / 2];
      const size_t row = tvc::partial_row(p, b, split, row0) + col;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int x = 4 * (elane + 32 * h);
        float4 v = *reinterpret_cast<const float4*>(out + col * OUT_LD + x);
        v.x *= inv, v.y *= inv, v.z *= inv, v.w *= inv;
        *reinterpret_cast<float4*>(p.o_part + row * DV + C * (DV / 2) + x) = v;
      }
    }
    trace_kernel(C, true);
  };
  if (wg == 0) {
    setmaxnreg_inc<SOFTMAX_REGS>();
    math(Const<0>{});
  } else {
    setmaxnreg_inc<PV_REGS>();
    math(Const<1>{});
  }
}

}  // namespace tvwide

#ifndef TV_LAYOUT_ONLY
TV_DEFINE_PARTIAL_KERNEL(tvwide, tree_verify_partial_wide)
#endif  // TV_LAYOUT_ONLY
