// specdiag-arch: sm_90a
// Hopper tree-verify partial kernel: two math warpgroups and a third that issues every load; 64
// query rows per CTA, 64-key tiles, 2 stages. Each math warpgroup c keeps half of O (columns
// 256 c ..) and adds P V for every tile: its own tile's P from registers, the other's from shared
// memory. P (t) goes where tile t's dims 512..575 were (only Q K^T (t) reads them; P V reads dims
// 0..511), so each stage carries its own P and Q plus two stages fit.
//
// The pair schedule (TV_PAIR=1, the default; FlashMLA's SM90 order): tiles go in pairs, math
// warpgroup 0 takes a = 2i (stage 0), 1 takes b = 2i + 1 (stage 1), both compute Q K^T at once
// and share the pair's max (verify_partial_pairs).
//
// Tiles in turns (TV_PAIR=0, FlashMLA's "seesaw"): math warpgroup c owns the tiles t with
// t % 2 == c and hands P (t), the row factors and the running max to the other. Step for its
// tile t (tile t - 1 is the other's):
//   (0) its P V (t - 2) done: arrive EMPTY (t - 2) (the loader puts tile t there);
//   (1) wait P (t - 1): rescale O by alpha (t - 1), issue P V (t - 1), P from shared memory;
//   (2) for each part of tile t: wait for its mbarrier, issue its 12 k-steps of Q K^T (t);
//   (3) P V (t - 1) done: arrive EMPTY (t - 1) (the loader puts tile t + 1 there);
//   (4) Q K^T (t) done: softmax, P (t) and the row factors into shared memory, arrive P (t);
//   (5) rescale O by alpha (t), issue P V (t), P from registers.
// A tile lands in 3 parts of 3 column blocks, each on its own mbarrier (cp.async.mbarrier.arrive),
// so Q K^T starts on the first. TV_TRACE=1: the timeline of one CTA, per tile in turns
// (tvsee::Event), per pair in the pair schedule (tvsee::PairEvent); specdiag.bench.trace.
// Both schedules mask a tree tile from two words of the host's packed ancestor mask
// (VerifyParams::tree_bits); TV_MASK_BITS=0 loads each key's mask byte instead.
// TV_SKIP (a -D bitmask of tvg::Skip) builds the stage ablations of either: results wrong by design.
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"
#include "tree_verify_sm90.cuh"

#ifndef TV_PAIR
#define TV_PAIR 1  // 0: tiles in turns (docs/kernel_notes.md, thirty-third session)
#endif
#ifndef TV_PV_FIRST
#define TV_PV_FIRST 0  // 1: in the pair schedule warpgroup 1 issues P V (b) before storing P (b) for warpgroup 0
#endif
#ifndef TV_MAX_FIRST
#define TV_MAX_FIRST 0  // 1: in the pair schedule each warpgroup hands its max over before its exponents
#endif
#ifndef TV_FREE_FIRST
#define TV_FREE_FIRST 0  // 1: in the pair schedule warpgroup 0 frees b - 1's late group before issuing Q K^T (a)
#endif
#ifndef TV_BLOCK_BARS
#define TV_BLOCK_BARS 0  // 1: in the pair schedule each column block of a tile lands on its own mbarrier
#endif
#ifndef TV_MASK_BITS
#define TV_MASK_BITS 1  // 0: tree tiles masked from a load of each key's mask byte (docs/kernel_notes.md, 39th session)
#endif
#ifndef TV_L2_PREFETCH
#define TV_L2_PREFETCH 0  // 64, 128 or 256: the tiles' cp.async carry that L2 prefetch size (0: none)
#endif

namespace tvsee {
using namespace tvg;
using tv::D;
using tv::DV;

constexpr int BN = 64;                         // keys per tile: the N of every Q K^T wgmma
constexpr int BM = 64;                         // query rows per CTA
constexpr int NB = D / 64;                     // column blocks of 64 head dims (9)
constexpr int TILE_B = NB * BN * 128;          // 73728
constexpr int Q_B = NB * BM * 128;             // 73728
constexpr int ROPE_OFF = (NB - 1) * BN * 128;  // column block 8 (dims 512..575): P's place once Q K^T is done
constexpr int P_B = BM * BN * 2;               // P [64 rows][64 keys] bf16
static_assert(P_B == TILE_B - ROPE_OFF, "P fills the rope block exactly");
constexpr int STAGES = 2;
constexpr int WG = 128;
constexpr int NT = 3 * WG;                     // math warpgroups 0 and 1, loader 2
constexpr int KSTEPS = D / 16;                 // k-steps of Q K^T (36)
constexpr int VH = DV / 2;                     // output columns per math warpgroup (256)
constexpr int SN = BN / 2;                     // score registers per thread (32)
// setmaxnreg moves registers within the CTA's allocation (ptxas' entry count for 384 threads,
// 65536 / 384 rounded down to 8, x 384): a budget over it leaves setmaxnreg.inc waiting forever.
constexpr int ENTRY_REGS = (65536 / NT) & ~7;  // 168
constexpr int MATH_REGS = 200, LOAD_REGS = 104;
static_assert(2 * MATH_REGS + LOAD_REGS <= 3 * ENTRY_REGS, "setmaxnreg budget over the CTA's registers");
constexpr float RESCALE_SLACK = 8.f;           // P <= 2^8: O is rescaled only when a row's max moves more
constexpr bool FAST_EXP = true;                // the scores' exp2 as one MUFU each (tvc::score_exp2)
constexpr int PARTS = 3;                       // a tile lands in 3 parts, each on its own mbarrier
constexpr int PART_BLOCKS = NB / PARTS;        // 3 column blocks, 12 k-steps of Q K^T
static_assert(NB % PARTS == 0, "whole column blocks per part");
constexpr int BARS = TV_BLOCK_BARS ? NB : PARTS;  // a stage's landing mbarriers
static_assert(!TV_BLOCK_BARS || TV_PAIR, "TV_BLOCK_BARS is the pair schedule's");
static_assert(PARTS * PART_BLOCKS * 4 == KSTEPS, "the parts' k-steps cover Q K^T");
static_assert(BN == 64 && VH == 256 && SN == 32, "the 64-key helpers of tree_verify_sm90.cuh");
static_assert(Q_B % 1024 == 0 && TILE_B % 1024 == 0 && ROPE_OFF % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");

template <bool ON>
struct PairP {};  // (empty in the turn-taking schedule's build)
template <>
struct PairP<true> {
  alignas(1024) uint8_t p[P_B];  // P of a pair's odd tile (its stage's rope block is freed early)
};
struct alignas(1024) Smem {  // the swizzle pattern is keyed to 1024-byte address bits
  uint8_t q[Q_B];
  uint8_t stage[STAGES][TILE_B];  // its rope block holds the tile's P once Q K^T is done
  float alpha[STAGES][BM];        // [tile % 2][row]: O's factor before P V (t)
  float max[STAGES][BM];          // [tile % 2][row]: the running max after tile t
  float sum[2][BM];               // [warpgroup][row]: its row sums (epilogue)
  uint64_t full[STAGES][BARS];    // mbarriers: the part (the pair schedule: group or column block) has landed
  PairP<TV_PAIR != 0> pair;       // the pair schedule only
};
constexpr int SMEM_BYTES = sizeof(Smem) + 1024;  // + slack to align the dynamic base to 1024
constexpr int TREE_BITS = TV_MASK_BITS;  // the tree tiles' mask from the host's packed bits
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");

// TV_TRACE=1: CTA (0, 0, 0) records clock64() at each Event of its first TRACE_TILES tiles, per
// math warpgroup (who = 0, 1; thread 0 of each) and for the loader (who = 2: its first warp in
// slots 0..2, its last warp in slots 3..5), in tv_trace; row TRACE_TILES holds each warpgroup's
// whole-kernel events (KernelEvent).
enum Event : int {
  kTop = 0,       // math: loop top, our P V (t - 2) done | loader: before waiting for tile t's stage
  kOtherP = 1,    // math: P (t - 1) received | loader: the stage is free
  kPart0 = 2,     // math: tile t's first part landed | loader: tile t's copies issued
  kPartsAll = 3,  // math: its last part landed
  kQKDone = 4,    // math: Q K^T (t) done, softmax starts
  kPArrived = 5,  // math: P (t) handed over
  kPVIssued = 6,  // math: P V (t) issued
};
enum KernelEvent : int {
  kEntry = 0,    // all: the kernel starts
  kLoopEnd = 1,  // math: its last P V done, the epilogue starts | loader: its last copies issued
  kDone = 2,     // math: its partial rows written | loader: its copies landed
};
__device__ __forceinline__ void trace(int who, int t, Event e) {
  if (TV_TRACE && t < TRACE_TILES && (blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    if ((threadIdx.x & 127) == 0) trace_clock(who, t, e);
    if (who == 2 && threadIdx.x == NT - 32) trace_clock(who, t, e + 3);
  }
}
// the pair schedule's: row i of who's part of tv_trace is pair i (tiles 2 i, 2 i + 1), thread 0 of
// each warpgroup; slot by role. (An event just after a bar.sync may be read before its wait ends:
// ptxas emits BAR.SYNC.DEFER_BLOCKING.)
enum PairEvent : int {
  // warpgroup 0
  kW0Top = 0,       // loop top, Q K^T (a)'s early group about to be issued
  kW0PrevPV = 1,    // P V (a - 1) done (its late group released)
  kW0QKDone = 2,    // Q K^T (a) done
  kW0MaxOut = 3,    // its max handed over (PAIR_MAX0)
  kW0PVDone = 4,    // P V (a) done
  kW0MaxIn = 5,     // the pair's max received (PAIR_MAX1)
  kW0POut = 6,      // P (a) stored and handed over (P0)
  kW0PVIssued = 7,  // P (b) received, P V (b) issued
  // warpgroup 1
  kW1Top = 0,       // loop top
  kW1QKDone = 1,    // Q K^T (b) done
  kW1MaxIn = 2,     // warpgroup 0's max received
  kW1MaxOut = 3,    // the pair's max handed over
  kW1PVIssued = 4,  // P (b) handed over, P V (b) issued
  kW1PIn = 5,       // P (a) received, P V (a) issued
  kW1PVDone1 = 6,   // P V (b) done (its early group released)
  kW1PVDone = 7,    // P V (a) done (its late group released)
  kW1POut = 10,     // P (b) fenced and handed over (after slots 8, 9: kGroupIn)
  // the loader (its first warp)
  kLTop = 0,        // loop top
  kLFreeE0 = 1,     // tile a's early group free, its copies next
  kLFreeE1 = 2,
  kLFreeL0 = 3,
  kLFreeL1 = 4,
  kLIssued = 5,     // the pair's copies issued
  kLIssuedE0 = 6,   // tile a's early group issued
  kLIssuedE1 = 7,
  kLIssuedL0 = 8,
  kLIssuedL1 = 9,
  kGroupIn = 8,     // both math warpgroups: group GR of their tile landed (slot 8 + GR)
};
__device__ __forceinline__ void trace_pair(int who, int pair, PairEvent e) {
  if (TV_TRACE && pair < TRACE_TILES && (blockIdx.x | blockIdx.y | blockIdx.z) == 0 && (threadIdx.x & 127) == 0)
    trace_clock(who, pair, e);
}
__device__ __forceinline__ void trace_kernel(int who, KernelEvent e) {
  if (TV_TRACE && (threadIdx.x & 127) == 0 && (blockIdx.x | blockIdx.y | blockIdx.z) == 0) trace_clock(who, TRACE_TILES, e);
  if (TV_TRACE && (threadIdx.x & 127) == 0) trace_cta(who, e);
}

// ---- layout arithmetic, host-callable (tests/cuda/wgmma_layout_check.cu) ----
// where tile t's P lives in its stage (stage base + ROPE_OFF), its layout and descriptors
TVG_HD constexpr uint32_t p_buf(uint32_t stage_base) { return stage_base + ROPE_OFF; }
TVG_HD constexpr uint32_t p_offset(int r, int nt, int t4) { return p64_offset(r, nt, t4); }
TVG_HD constexpr uint64_t p_desc(uint32_t buf, int kk) { return p64_desc(buf, kk); }
TVG_HD constexpr uint64_t v_desc(uint32_t tile_base, int wg, int kk) { return v64_desc(tile_base, wg, kk); }
// the bytes between P V's k-steps in P's buffer and in the tile (desc_add)
constexpr uint32_t P_KSTEP = 256, V_KSTEP = 16 * 128;
static_assert(p_desc(0, 1) == desc_add(p_desc(0, 0), P_KSTEP) && v_desc(0, 1, 1) == desc_add(v_desc(0, 1, 0), V_KSTEP), "k-step strides");

// Math warpgroup C's half of P V over the tile at tile_base, P from registers (pv_regs) or from
// p_base (pv_smem); each operand's descriptor built once and stepped by desc_add
template <int C>
__device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&a)[BN / 16][4], uint32_t tile_base) {
  const uint64_t dv = v_desc(tile_base, C, 0);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    if constexpr (runs(kSkipPV)) wgmma_pv(o, a[kk], desc_add(dv, V_KSTEP * kk));
}
template <int C>
__device__ __forceinline__ void pv_smem(float (&o)[128], uint32_t p_base, uint32_t tile_base) {
  const uint64_t dp = p_desc(p_base, 0), dv = v_desc(tile_base, C, 0);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    if constexpr (runs(kSkipPV)) wgmma_pv_ss(o, desc_add(dp, P_KSTEP * kk), desc_add(dv, V_KSTEP * kk));
}

// Every stage's part mbarriers, by thread 0 (the loader's 128 threads arrive on each through
// cp.async.mbarrier.arrive), then the CTA's only barrier
__device__ __forceinline__ void init_parts(uint32_t full0) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES * BARS; ++i) mbar_init(full0 + 8 * i, WG);
    mbar_fence_init();
  }
  __syncthreads();
}

// Both math warpgroups, after their last P V: the whole row sums (both warpgroups' tiles), then
// the normalised partial rows and their lse (natural log); an empty split: m = -inf, l = 0
__device__ __forceinline__ void write_rows(const tv::VerifyParams& p, Smem& sm, float (&o)[128], const float (&m_r)[2],
                                           float (&l_r)[2], int c, int wr, int g, int t4, int row0, int split, int b) {
  tvc::quad_sum_rows(l_r);
  if (t4 == 0) {  // (m_r is the same in both warpgroups: the max after the last tile)
    sm.sum[c][wr + g] = l_r[0];
    sm.sum[c][wr + g + 8] = l_r[1];
  }
  bar_sync(kBarMath, 2 * WG);
  const float* other = &sm.sum[c ^ 1][wr + g];
  l_r[0] += other[0];
  l_r[1] += other[8];
  tvc::write_partial_rows(p, o, m_r, l_r, b, split, row0 + wr, g, t4, c * VH, c == 0);
}

// ---- TV_PAIR=1: the pair schedule (FlashMLA's SM90 order; our own code, the fifteenth session's
// be698d1 on today's helpers). Tiles go in pairs (a = 2i in stage 0, b = 2i + 1 in stage 1); math
// warpgroup 0 owns a, 1 owns b, and both compute their Q K^T at once. The pair shares one reference
// max, moved only past RESCALE_SLACK: warpgroup 1 takes warpgroup 0's and its own tile's, and
// warpgroup 0 rescales P (a) and its O to it. Each warpgroup keeps its half of O and adds both
// tiles' P V: its own P from registers, the other's from shared memory (P (a) in its stage's rope
// block, P (b) in a buffer of its own). A stage's column blocks land and are freed in two groups:
// the early group is read only by its owner (Q K^T, then its V half), the late group also by the
// other warpgroup (its V half, and in stage 0 P (a)); the loader refills a group once its last
// reader frees it.
constexpr int GROUPS = 2, EARLY_BLOCKS = 4, LATE_BLOCKS = NB - EARLY_BLOCKS;
constexpr int PAIR_MATH_REGS = 224, PAIR_LOAD_REGS = 56;
static_assert(2 * PAIR_MATH_REGS + PAIR_LOAD_REGS <= 3 * ENTRY_REGS, "setmaxnreg budget over the CTA's registers");
static_assert(GROUPS <= BARS, "the pair schedule's group mbarriers live in Smem::full");
// column block j of group gr of a tile in stage s: stage 0: early 0..3, late 4..8 (P (a), written
// where the rope block was, is read with the late group); stage 1: early 4..8, late 0..3 (P (b)
// has a buffer of its own, so the rope block goes with its owner's V half)
TVG_HD constexpr int group_block(int s, int gr, int j) { return (s ^ gr) ? 4 + j : j; }
TVG_HD constexpr int group_blocks(int s, int gr) { return (s ^ gr) ? LATE_BLOCKS : EARLY_BLOCKS; }
// P fragments (pack_p: a[kk][j] holds row g for even j, g + 8 for odd) times their row's factor
__device__ __forceinline__ void scale_packed(uint32_t (&pa)[BN / 16][4], const float (&f)[2]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pa[kk][j]));
      pa[kk][j] = tvc::pack_bf16(v.x * f[j & 1], v.y * f[j & 1]);
    }
}
// exp2(m_old - m_new), a row with no visible key yet (m_new = -inf) taken at 0
__device__ __forceinline__ float max_factor(float m_old, float m_new) { return exp2f(m_old - (m_new == -INFINITY ? 0.f : m_new)); }

template <int = 0>
__device__ __forceinline__ void verify_partial_pairs(const tv::VerifyParams& p) {
  Smem& sm = aligned_smem<Smem>();
  const uint32_t sQ = smem_u32(sm.q), sK = smem_u32(sm.stage);
  const uint32_t full0 = smem_u32(sm.full);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // (warp-uniform to ptxas: see verify_partial)
  const int wr = (warp & 3) * 16;
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  trace_kernel((int)opaque(wg), kEntry);
  const tvc::SplitWork w = tvc::split_work<BN>(p, split, b);
  const int n = w.n_tiles;
  const auto stage = [&](int tile) { return sK + (tile & 1) * TILE_B; };
  // group gr's mbarrier (TV_BLOCK_BARS: column block gr's)
  const auto full = [&](int tile, int gr) { return full0 + 8 * ((tile & 1) * BARS + gr); };

  init_parts(full0);

  if (wg == 2) {
    // ------------------------------------------------ warpgroup 2: every load
    setmaxnreg_dec<PAIR_LOAD_REGS>();
    if (n > 0) {
      const KeyLoader<BN, WG> ld(p, w, tid - 2 * WG, b);
      using Pages = KeyLoader<BN, WG>::Pages;
      // group GR of `tile` (in stage S = tile % 2), both as one constant: Const<2 S + GR>
      auto load_group = [&](int tile, auto sg_c, const Pages& k) {
        constexpr int S = decltype(sg_c)::value >> 1, GR = decltype(sg_c)::value & 1;
        static_assert(group_block(S, GR, 1) == group_block(S, GR, 0) + 1, "a group's column blocks are consecutive");
        if constexpr (TV_BLOCK_BARS) {
#pragma unroll
          for (int j = 0; j < group_blocks(S, GR); ++j) {
            ld.copy<TV_L2_PREFETCH, 1>(stage(tile), tile, k, group_block(S, GR, j));
            cp_async_mbar_arrive(full(tile, group_block(S, GR, j)));
          }
        } else {
          ld.copy<TV_L2_PREFETCH, group_blocks(S, GR)>(stage(tile), tile, k, group_block(S, GR, 0));
          cp_async_mbar_arrive(full(tile, GR));
        }
      };
      Pages ka, kb;
      ld.pages(0, ka);
      if (n > 1) ld.pages(1, kb);
      load_q<BM, WG>(p, sQ, ld.t, b, row0);
      for (int a = 0; a < n; a += 2) {
        const bool has_b = a + 1 < n;
        const int i = a >> 1;
        trace_pair(2, i, kLTop);
        // a stage's group is refilled once its last reader has freed it (the uses alternate: that
        // reader frees it again only after reading what this load puts there)
        if (a >= 2) bar_sync(kBarPairFreeE0, 2 * WG);
        trace_pair(2, i, kLFreeE0);
        load_group(a, Const<0>{}, ka);
        trace_pair(2, i, kLIssuedE0);
        if (has_b) {
          if (a >= 2) bar_sync(kBarPairFreeE1, 2 * WG);
          trace_pair(2, i, kLFreeE1);
          load_group(a + 1, Const<2>{}, kb);
          trace_pair(2, i, kLIssuedE1);
        }
        if (a >= 2) bar_sync(kBarPairFreeL0, 2 * WG);
        trace_pair(2, i, kLFreeL0);
        load_group(a, Const<1>{}, ka);
        trace_pair(2, i, kLIssuedL0);
        if (has_b) {
          if (a >= 2) bar_sync(kBarPairFreeL1, 2 * WG);
          trace_pair(2, i, kLFreeL1);
          load_group(a + 1, Const<3>{}, kb);
          trace_pair(2, i, kLIssuedL1);
        }
        trace_pair(2, i, kLIssued);
        if (a + 2 < n) ld.pages(a + 2, ka);
        if (a + 3 < n) ld.pages(a + 3, kb);
      }
      trace_kernel(2, kLoopEnd);
      cp_async_wait<0>();
      trace_kernel(2, kDone);
    }
    return;
  }

  // ------------------------------------------------ warpgroups 0 and 1: the math
  setmaxnreg_inc<PAIR_MATH_REGS>();
  const int c = wg;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};  // the pair's max after the last pair (both warpgroups)
  float l_r[2] = {0.f, 0.f};              // this thread's share of the row sums of this warpgroup's tiles
  auto fence_o = [&]() { fence_operands(o); };

  auto math = [&](auto first) {
    constexpr int C = decltype(first)::value;
    float s[SN];
    uint32_t pa[BN / 16][4];
    auto fence_s = [&]() { fence_operands(s); };
    // group gr of Q K^T (tile) into s, once it has landed (TV_BLOCK_BARS: each column block once it has)
    auto qk_group = [&](int tile, auto gr_c) {
      constexpr int GR = decltype(gr_c)::value;
      const uint32_t qb = opaque(sQ), kb = opaque(stage(tile));  // (visible bases: ptxas hoists every descriptor and spills)
      const uint64_t dq = kstep_desc(qb, BM, 0), dk = kstep_desc(kb, BN, 0);
      auto landed = [&](int bar) {
        mbar_wait(full(tile, bar), (tile >> 1) & 1);
        fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
      };
      if constexpr (!TV_BLOCK_BARS) {
        landed(GR);
        trace_pair(C, tile >> 1, PairEvent(kGroupIn + GR));
      }
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < group_blocks(C, GR); ++j) {
        if constexpr (TV_BLOCK_BARS) {
          landed(group_block(C, GR, j));
          if (j == 0) trace_pair(C, tile >> 1, PairEvent(kGroupIn + GR));  // (its first block)
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int ks = 4 * group_block(C, GR, j) + k;
          if constexpr (runs(kSkipQK))
            wgmma_qk64(s, desc_add(dq, kstep_offset(BM, ks)), desc_add(dk, kstep_offset(BN, ks)), GR > 0 || j > 0 || k > 0);
          else if (GR == 0 && j == 0 && k == 0)
            for (int i = 0; i < SN; ++i) s[i] = 0.f;
        }
      }
      wgmma_commit();
    };
    // scores stay unscaled: the max is scaled once and each exponent takes the scale in its FFMA,
    // exp2(s * scale - m) (32 multiplies a tile fewer than scaling the scores)
    auto mask = [&](int tile) {
      if constexpr (!runs(kSkipSoftmax)) return;
      if (runs(kSkipMask) && (w.is_tree || (w.tile_begin + tile + 1) * BN > w.kv_len)) {
        if (TV_MASK_BITS && w.is_tree) {
          const int grow = row0 + wr + g, t = w.tile_begin + tile;
          tvc::mask_scores_bits<BN, false>(p, s, tvc::tree_word(p, b, grow, t), tvc::tree_word(p, b, grow + 8, t), t4);
        } else {
          tvc::mask_scores<BN, false>(p, s, g, t4, tile, w, row0 + wr, b);
        }
      }
    };
    // this warpgroup's P fragments into the tile's P buffer: a's in its stage's rope block, b's apart
    const uint32_t p_odd = smem_u32(reinterpret_cast<PairP<true>&>(sm.pair).p);  // (sm.pair is PairP<true> here)
    auto p_of = [&](int tile) { return (tile & 1) ? p_odd : p_buf(stage(tile)); };
    auto store_p = [&](int tile, bool fence = true) {
      const uint32_t pb = p_of(tile);
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        st_shared_u32(pb + p_offset(wr + g, nt, t4), pa[nt >> 1][2 * (nt & 1)]);
        st_shared_u32(pb + p_offset(wr + g + 8, nt, t4), pa[nt >> 1][2 * (nt & 1) + 1]);
      }
      if (fence) fence_proxy_async();  // P is read by the other warpgroup's wgmma (async proxy)
    };
    // the softmax's steps (TV_SKIP's kSkipSoftmax: no max, no exponent, every factor 1)
    auto row_max = [&](int r) {
      const float mx = runs(kSkipSoftmax) ? tvc::quad_row_max<BN>(s, r) : -INFINITY;
      return mx * p.scale_log2;
    };
    auto row_exp = [&](int r, float m) {
      if constexpr (!runs(kSkipSoftmax)) return 0.f;
      return tvc::exp2_row<BN, FAST_EXP, true>(s, r, m, p.scale_log2);
    };
    auto factor = [&](float m_old, float m_new) { return runs(kSkipSoftmax) ? max_factor(m_old, m_new) : 1.f; };
    // the reference max after a tile whose row max is mx, moved only by more than the slack (P <=
    // 2^slack; on most tiles every factor is 1 and O, P (a) are not rescaled)
    auto next_max = [&](float m_ref, float mx) { return mx > m_ref + RESCALE_SLACK ? mx : m_ref; };
    auto any_factor = [&](const float (&f)[2]) { return __any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f); };
    auto rescale_o = [&](const float (&f)[2]) {
      if (any_factor(f)) tvc::rescale_rows(o, f);
    };
    float* const my_max = &sm.max[C][wr + g];
    auto pv_rs = [&](uint32_t tile_base) { pv_regs<C>(o, pa, tile_base); };
    auto pv_ss = [&](uint32_t p_base, uint32_t tile_base) { pv_smem<C>(o, p_base, tile_base); };

    if constexpr (C == 0) {
      // ---- warpgroup 0: tiles a
      for (int a = 0; a < n; a += 2) {
        const bool has_b = a + 1 < n;
        const int i = a >> 1;
        trace_pair(0, i, kW0Top);
        // Q K^T (a): the early group while P V (a - 1) may still run (TV_FREE_FIRST: once it is
        // done, so the loader refills a - 1's late group, tile a + 1's Q K^T input, sooner), then the late one
        auto free_prev = [&]() {
          if (a < 2) return;
          wgmma_wait<TV_FREE_FIRST ? 0 : 1>();
          fence_o();
          trace_pair(0, i, kW0PrevPV);
          if (a + 1 < n) bar_arrive(kBarPairFreeL1, 2 * WG);  // a - 1's late group (our V half and its P) is read
        };
        fence_s();
        if constexpr (TV_FREE_FIRST) free_prev();
        qk_group(a, Const<0>{});
        if constexpr (!TV_FREE_FIRST) free_prev();
        qk_group(a, Const<1>{});
        wgmma_wait<0>();
        fence_o();
        fence_s();
        trace_pair(0, i, kW0QKDone);
        // softmax of tile a at its own reference max m0, which warpgroup 1 takes; O to m0
        mask(a);
        float m0[2], f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m0[r] = next_max(m_r[r], row_max(r));
          f[r] = factor(m_r[r], m0[r]);
          if constexpr (!TV_MAX_FIRST) l_r[r] = l_r[r] * f[r] + row_exp(r, m0[r] == -INFINITY ? 0.f : m0[r]);
        }
        if (TV_MAX_FIRST || t4 == 0) {  // (every lane with TV_MAX_FIRST: each reads its own store back)
          my_max[0] = m0[0];
          my_max[8] = m0[1];
        }
        bar_arrive(kBarPairMax0, 2 * WG);
        if constexpr (TV_MAX_FIRST) {
          // the exponents at the max read back after the arrive: that ties them to it (an arrive
          // orders memory only, and ptxas moves them above a bare one)
          const volatile float* back = my_max;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float mu = back[8 * r];
            l_r[r] = l_r[r] * f[r] + row_exp(r, mu == -INFINITY ? 0.f : mu);
          }
        }
        trace_pair(0, i, kW0MaxOut);
        rescale_o(f);
        // our half of P V (a), P from registers
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) tvc::pack_p(pa[kk], s, kk);
        wgmma_fence();
        pv_rs(stage(a));
        wgmma_commit();
        wgmma_wait<0>();
        fence_o();
        trace_pair(0, i, kW0PVDone);
        if (a + 2 < n) bar_arrive(kBarPairFreeE0, 2 * WG);  // a's early group: only we read it
        // the pair's max M from warpgroup 1: P (a) and O to M, P (a) to warpgroup 1
        bar_sync(kBarPairMax1, 2 * WG);
        trace_pair(0, i, kW0MaxIn);
        const float* mx = &sm.max[1][wr + g];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mm = mx[8 * r];
          f[r] = factor(m0[r], mm);
          m_r[r] = mm;
          l_r[r] *= f[r];
        }
        if (any_factor(f)) scale_packed(pa, f);
        store_p(a);
        bar_arrive(kBarP0, 2 * WG);
        trace_pair(0, i, kW0POut);
        rescale_o(f);
        // our half of P V (b), P from its owner's buffer (left running into the next pair)
        if (has_b) {
          bar_sync(kBarP1, 2 * WG);
          wgmma_fence();
          pv_ss(p_odd, stage(a + 1));
          wgmma_commit();
          trace_pair(0, i, kW0PVIssued);
        }
      }
      wgmma_wait<0>();
      fence_o();
    } else {
      // ---- warpgroup 1: tiles b
      for (int a = 0; a < n; a += 2) {
        const bool has_b = a + 1 < n;
        const int i = a >> 1;
        trace_pair(1, i, kW1Top);
        if (has_b) {
          fence_s();
          qk_group(a + 1, Const<0>{});
          qk_group(a + 1, Const<1>{});
          wgmma_wait<0>();
          fence_o();
          fence_s();
          trace_pair(1, i, kW1QKDone);
          mask(a + 1);
        }
        // the pair's max M from warpgroup 0's and our tile's; O to M (with our tile, one block of both
        // rows: ptxas interleaves them)
        float mb[2];  // our tile's row maxima (TV_MAX_FIRST: before the wait)
        if (TV_MAX_FIRST && has_b) {
#pragma unroll
          for (int r = 0; r < 2; ++r) mb[r] = row_max(r);
        }
        bar_sync(kBarPairMax0, 2 * WG);
        trace_pair(1, i, kW1MaxIn);
        const float* m0 = &sm.max[0][wr + g];
        float f[2];
        if (has_b) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float mm = next_max(m0[8 * r], TV_MAX_FIRST ? mb[r] : row_max(r));
            f[r] = factor(m_r[r], mm);
            if constexpr (!TV_MAX_FIRST) l_r[r] = l_r[r] * f[r] + row_exp(r, mm == -INFINITY ? 0.f : mm);
            m_r[r] = mm;
          }
        } else {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            f[r] = factor(m_r[r], m0[8 * r]);
            l_r[r] *= f[r];
            m_r[r] = m0[8 * r];
          }
        }
        if (TV_MAX_FIRST || t4 == 0) {  // (every lane with TV_MAX_FIRST: each reads its own store back)
          my_max[0] = m_r[0];
          my_max[8] = m_r[1];
        }
        bar_arrive(kBarPairMax1, 2 * WG);
        trace_pair(1, i, kW1MaxOut);
        if (TV_MAX_FIRST && has_b) {  // the exponents after the hand-off (M read back, as warpgroup 0 does)
          const volatile float* back = my_max;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float mu = back[8 * r];
            l_r[r] = l_r[r] * f[r] + row_exp(r, mu == -INFINITY ? 0.f : mu);
          }
        }
        rescale_o(f);
        // P (b) to warpgroup 0, its proxy fence after our half of P V (b) is issued (P from registers:
        // it reads no P from shared memory)
        if (has_b) {
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) tvc::pack_p(pa[kk], s, kk);
          if constexpr (!TV_PV_FIRST) store_p(a + 1, false);
          wgmma_fence();
          pv_rs(stage(a + 1));
          wgmma_commit();
          trace_pair(1, i, kW1PVIssued);
          // (the stores read the P V's A fragments before its wait, as FlashMLA's sparse prefill
          // does; PTX leaves that undefined: the float64 check decides)
          if constexpr (TV_PV_FIRST) store_p(a + 1, false);
          fence_proxy_async();
          bar_arrive(kBarP1, 2 * WG);
          trace_pair(1, i, kW1POut);
        }
        // our half of P V (a), P (a) at M from warpgroup 0
        bar_sync(kBarP0, 2 * WG);
        wgmma_fence();
        pv_ss(p_buf(stage(a)), stage(a));
        wgmma_commit();
        trace_pair(1, i, kW1PIn);
        if (has_b) {
          wgmma_wait<1>();
          fence_o();
          trace_pair(1, i, kW1PVDone1);
          if (a + 3 < n) bar_arrive(kBarPairFreeE1, 2 * WG);  // b's early group: only we read it
        }
        wgmma_wait<0>();
        fence_o();
        trace_pair(1, i, kW1PVDone);
        if (a + 2 < n) bar_arrive(kBarPairFreeL0, 2 * WG);  // a's late group (our V half and its P) is read
      }
    }
  };
  if (n > 0) {
    if (c == 0)
      math(Const<0>{});
    else
      math(Const<1>{});
  }
  trace_kernel(c, kLoopEnd);

  write_rows(p, sm, o, m_r, l_r, c, wr, g, t4, row0, split, b);
  trace_kernel(c, kDone);
}

// (a template: the schedule not built is not instantiated)
template <int = 0>
__device__ __forceinline__ void verify_partial(const tv::VerifyParams& p) {
  if constexpr (TV_PAIR) {
    verify_partial_pairs(p);
    return;
  }
  Smem& sm = aligned_smem<Smem>();
  const uint32_t sQ = smem_u32(sm.q), sK = smem_u32(sm.stage);
  const uint32_t full0 = smem_u32(sm.full);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // (broadcast from lane 0, so ptxas knows it warp-uniform: the descriptors the math computes stay
  // in uniform registers, with no R2UR before each wgmma)
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int wr = (warp & 3) * 16;  // this warp's 16 rows within the CTA's 64 (math warpgroups)
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  trace_kernel((int)opaque(wg), kEntry);  // (opaque: else the loader's events reuse this address, kept live and spilled)
  const tvc::SplitWork w = tvc::split_work<BN>(p, split, b);
  const int n = w.n_tiles;
  const auto stage = [&](int tile) { return sK + (tile & 1) * TILE_B; };
  const auto full = [&](int tile, int part) { return full0 + 8 * ((tile & 1) * PARTS + part); };
  const auto bar_empty = [](int tile) { return (tile & 1) ? kBarEmpty1 : kBarEmpty0; };

  init_parts(full0);

  if (wg == 2) {
    // ------------------------------------------------ warpgroup 2: every load
    setmaxnreg_dec<LOAD_REGS>();
    if (n > 0) {
      const KeyLoader<BN, WG> ld(p, w, tid - 2 * WG, b);
      const int t = ld.t;
      using Pages = KeyLoader<BN, WG>::Pages;
      // tile `tile` part by part, each part's arrive completing its mbarrier once this thread's
      // copies so far (Q's too) have landed
      auto load_tile = [&](int tile, const Pages& k) {
#pragma unroll
        for (int part = 0; part < PARTS; ++part) {
          ld.copy<TV_L2_PREFETCH, PART_BLOCKS>(stage(tile), tile, k, part * PART_BLOCKS);
          cp_async_mbar_arrive(full(tile, part));
        }
      };
      Pages k;
      ld.pages(0, k);
      load_q<BM, WG>(p, sQ, t, b, row0);
      load_tile(0, k);
      if (n > 1) {
        ld.pages(1, k);
        load_tile(1, k);
      }
      for (int j = 0; j + 2 < n; ++j) {
        ld.pages(j + 2, k);
        // both math warpgroups are done with tile j. They arrive EMPTY (j + 2) only after tile
        // j + 2's mbarrier (or P_READY (j + 2)), which needs this load: the uses alternate
        trace(2, j + 2, kTop);
        bar_sync(bar_empty(j), NT);
        trace(2, j + 2, kOtherP);
        load_tile(j + 2, k);
        trace(2, j + 2, kPart0);
      }
      trace_kernel(2, kLoopEnd);
      cp_async_wait<0>();
      trace_kernel(2, kDone);
    }
    return;
  }

  // ------------------------------------------------ warpgroups 0 and 1: the math
  setmaxnreg_inc<MATH_REGS>();
  const int c = wg;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};  // the running max after the last tile seen (both warpgroups)
  float l_r[2] = {0.f, 0.f};              // this thread's share of the row sums of this warpgroup's tiles
  auto fence_o = [&]() { fence_operands(o); };

  // The loop runs with this warpgroup's first tile C as a compile-time constant: with t starting
  // at a thread-derived value, ptxas takes every wgmma under a t-dependent condition as
  // divergent and serialises them all (C7520).
  auto math = [&](auto first) {
    constexpr int C = decltype(first)::value;
    // barriers of our tiles and of the other's, as immediates (C is known at compile time)
    constexpr int P_OURS = C ? kBarP1 : kBarP0, P_OTHERS = C ? kBarP0 : kBarP1;
    constexpr int EMPTY_OURS = C ? kBarEmpty1 : kBarEmpty0, EMPTY_OTHERS = C ? kBarEmpty0 : kBarEmpty1;
    float s[SN];
    uint32_t a[BN / 16][4];  // P (t) as the A fragments of P V
    float alpha[2];
    // (1) the other warpgroup's tile u: O rescaled by its factor, our half of its P V
    auto other_tile = [&](int u) {
      // the owner arrives P (u + 2) only after tile u + 2 landed, which needs our EMPTY (u) in (3)
      bar_sync(P_OTHERS, 2 * WG);
      trace(C, u + 1, kOtherP);
      fence_proxy_async();  // (the tile's V reached us through the owner's barriers)
      const float* al = &sm.alpha[u & 1][wr + g];
      const float* mx = &sm.max[u & 1][wr + g];
      const float au[2] = {al[0], al[8]};
      m_r[0] = mx[0];
      m_r[1] = mx[8];
      l_r[0] *= au[0];
      l_r[1] *= au[1];
      if (__any_sync(0xffffffffu, au[0] != 1.f || au[1] != 1.f)) tvc::rescale_rows(o, au);  // O is idle: (0)
      wgmma_fence();
      pv_smem<C>(o, p_buf(stage(u)), stage(u));
    };
    for (int t = C; t < n; t += 2) {
      // (0) our P V (t - 2) is done: the loader may put tile t in its stage (the wait is
      // unconditional so that ptxas sees O idle from here on, whichever the tile)
      wgmma_wait<0>();
      fence_o();
      trace(C, t, kTop);
      if (t >= 2) bar_arrive(EMPTY_OURS, NT);
      if (t >= 1) other_tile(t - 1);
      wgmma_commit();  // (empty for tile 0: the same group count on every path, for (3)'s wait)
      // (2) our tile t: S = Q K^T over all 576 dims, each part's k-steps once it has landed
      fence_operands(s);
      const uint64_t dq = kstep_desc(sQ, BM, 0), dk = kstep_desc(stage(t), BN, 0);
#pragma unroll
      for (int part = 0; part < PARTS; ++part) {
        mbar_wait(full(t, part), (t >> 1) & 1);
        if (part == 0) trace(C, t, kPart0);
        if (part == PARTS - 1) trace(C, t, kPartsAll);
        fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
        wgmma_fence();
#pragma unroll
        for (int ks = part * 4 * PART_BLOCKS; ks < (part + 1) * 4 * PART_BLOCKS; ++ks)
          if constexpr (runs(kSkipQK)) {
            wgmma_qk64(s, desc_add(dq, kstep_offset(BM, ks)), desc_add(dk, kstep_offset(BN, ks)), ks > 0);
          } else if (ks == 0) {
            for (int i = 0; i < SN; ++i) s[i] = 0.f;
          }
      }
      wgmma_commit();
      // (3) our P V (t - 1) is done (it was issued before Q K^T (t)): tile t + 1 may take its stage
      wgmma_wait<1>();
      fence_o();
      if (t >= 1 && t + 1 < n) bar_arrive(EMPTY_OTHERS, NT);
      // (4) the softmax of tile t
      wgmma_wait<0>();
      fence_operands(s);
      fence_o();
      trace(C, t, kQKDone);
      if (!runs(kSkipMask) || (!w.is_tree && (w.tile_begin + t + 1) * BN <= w.kv_len)) {  // a whole prefix tile
#pragma unroll
        for (int i = 0; i < SN; ++i) s[i] *= p.scale_log2;
      } else if constexpr (runs(kSkipSoftmax)) {  // a tree tile, or the prefix's last
        if (TV_MASK_BITS && w.is_tree) {
          const int grow = row0 + wr + g, tt = w.tile_begin + t;
          tvc::mask_scores_bits<BN>(p, s, tvc::tree_word(p, b, grow, tt), tvc::tree_word(p, b, grow + 8, tt), t4);
        } else {
          tvc::mask_scores<BN>(p, s, g, t4, t, w, row0 + wr, b);
        }
      }
      bool rescale = false;
      if constexpr (runs(kSkipSoftmax)) {
        rescale = tvc::online_softmax_lazy<BN, FAST_EXP>(s, m_r, l_r, alpha, RESCALE_SLACK);
      } else {
        alpha[0] = alpha[1] = 1.f;
      }
      if (t4 == 0) {
        float* al = &sm.alpha[t & 1][wr + g];
        float* mx = &sm.max[t & 1][wr + g];
        al[0] = alpha[0];
        al[8] = alpha[1];
        mx[0] = m_r[0];
        mx[8] = m_r[1];
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) tvc::pack_p(a[kk], s, kk);
      const uint32_t pb = p_buf(stage(t));  // Q K^T (t), the rope block's only reader, is done
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        st_shared_u32(pb + p_offset(wr + g, nt, t4), a[nt >> 1][2 * (nt & 1)]);
        st_shared_u32(pb + p_offset(wr + g + 8, nt, t4), a[nt >> 1][2 * (nt & 1) + 1]);
      }
      fence_proxy_async();  // P is read by the other warpgroup's wgmma (async proxy)
      bar_arrive(P_OURS, 2 * WG);
      trace(C, t, kPArrived);
      // (5) our half of P V (t), P from registers; O is idle: (3) and (4) waited
      if (rescale) tvc::rescale_rows(o, alpha);
      wgmma_fence();
      pv_regs<C>(o, a, stage(t));
      wgmma_commit();
      trace(C, t, kPVIssued);
    }
    wgmma_wait<0>();
    fence_o();
    if (((n - 1) & 1) != C) {  // the last tile is the other's: our half of its P V
      other_tile(n - 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_o();
    }
  };
  if (n > 0) {
    if (c == 0)
      math(Const<0>{});
    else
      math(Const<1>{});
  }

  trace_kernel(c, kLoopEnd);
  write_rows(p, sm, o, m_r, l_r, c, wr, g, t4, row0, split, b);
  trace_kernel(c, kDone);
}

}  // namespace tvsee

#ifndef TV_LAYOUT_ONLY
TV_DEFINE_PARTIAL_KERNEL(tvsee, tree_verify_partial_seesaw)
#endif  // TV_LAYOUT_ONLY
