// Hopper (sm_90a) building blocks of tree_verify_wgmma.cu, tree_verify_seesaw.cu and
// tree_verify_wide.cu: the 128-byte-swizzled tile layout that both cp.async writes and wgmma
// reads, wgmma shared-memory descriptors, 16-byte cp.async tile loads and the loaders' key rows
// (key_source, key_pages, key_ptr, key_in; KeyLoader, one loader thread of them), mbarriers, named
// barriers, and the wgmma instructions.
// The layout helpers are host-callable (TVG_HD): tests/cuda/wgmma_layout_check.cu checks them on a CPU.
//
// Tile layout: a tile of `rows` 576-wide bf16 token rows is 9 column blocks of 64 head dims; in a
// block, token row r is 128 contiguous bytes at r * 128 with its 16-byte chunk c stored at chunk
// position c ^ (r % 8); every block starts 1024-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"

namespace tvg {

#define TVG_HD __host__ __device__ __forceinline__
// byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a swizzled tile of `rows` rows
TVG_HD constexpr uint32_t tile_offset(int rows, int row, int chunk) {
  return (uint32_t)((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
// cp.async assignment over THREADS threads: thread t copies chunks 8 c + t % 8 (c = 0..8) of rows
// t / 8 + (THREADS / 8) i; a quarter-warp reads 128 contiguous bytes of one row
template <int THREADS>
TVG_HD constexpr int load_row(int t, int i) { return (t >> 3) + (THREADS / 8) * i; }
TVG_HD constexpr int load_chunk(int t, int c) { return 8 * c + (t & 7); }
// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
// K-major operand: sbo = byte step between 8-row groups (lbo unused: 16).
// MN-major operand: lbo = byte step between 64-element atoms along M/N, sbo = between 8-row groups along K.
TVG_HD constexpr uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// Shared-memory matrix descriptor, no swizzle (the "interleave" canonical layout: 8 x 16-byte
// core matrices). K-major operand: lbo = byte step between core matrices along K, sbo = along M/N.
TVG_HD constexpr uint64_t make_desc_interleave(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}
// K-major operand of k-step `k16` (head dims 16 k16 .. 16 k16 + 15) of a tile of `rows` rows:
// column block k16 / 4, then the 32-byte step inside its 128-byte rows
TVG_HD constexpr uint32_t kstep_offset(int rows, int k16) { return (uint32_t)((k16 >> 2) * rows * 128 + (k16 & 3) * 32); }
TVG_HD constexpr uint64_t kstep_desc(uint32_t tile_base, int rows, int k16) {
  return make_desc(tile_base + kstep_offset(rows, k16), 16, 1024);
}
// The descriptor of `desc`'s address plus `off` bytes, a 32-bit add on the low word: the address
// field holds (saddr & 0x3FFFF) >> 4 and a shared address under 256 KB carries nothing out of it
TVG_HD constexpr uint64_t desc_add(uint64_t desc, uint32_t off) {
  return (desc & ~0xFFFFFFFFull) | (uint32_t)((uint32_t)desc + (off >> 4));
}
// MN-major operand (the tile read transposed: V of P V) of keys 16 kk .. 16 kk + 15 and the
// columns from column block `block` on: 64-column blocks rows * 128 bytes apart
TVG_HD constexpr uint64_t mn_desc(uint32_t tile_base, int rows, int block, int kk) {
  return make_desc(tile_base + block * rows * 128 + 16 * kk * 128, rows * 128, 1024);
}

// The 64-key tiles' P (tree_verify_seesaw.cu): P [64 rows][64 keys]
// bf16 in 8-row x 16-byte core matrices (no swizzle, 8192 bytes): chunk c (keys 8 c ..) of row r
// at (r / 8) * 1024 + c * 128 + (r % 8) * 16. Where a thread's P values of 8-key group nt go:
// row r, keys 8 nt + 2 t4 and + 1 (4 bytes)
TVG_HD constexpr uint32_t p64_offset(int r, int nt, int t4) { return (uint32_t)((r >> 3) * (64 * 16) + nt * 128 + (r & 7) * 16 + 4 * t4); }
// A operand of P V: keys 16 kk .. 16 kk + 15 of the P buffer, K-major, no swizzle
TVG_HD constexpr uint64_t p64_desc(uint32_t p_buf, int kk) { return make_desc_interleave(p_buf + kk * 256, 128, 64 * 16); }
// B operand of warpgroup `wg`'s P V on a 64-key tile: keys 16 kk .., output columns 256 wg ..
TVG_HD constexpr uint64_t v64_desc(uint32_t tile_base, int wg, int kk) { return mn_desc(tile_base, 64, wg * 4, kk); }

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// x, opaque to the compiler: it cannot hoist (and keep in registers) what is computed from it
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 16 bytes from `src`, or zeros where !in (ignore-src: src is not read); an L2 miss fetches PF
// bytes (64, 128 or 256) around src from DRAM, 0: the line alone. (A src-size register instead
// of the predicate made ptxas add (16 - size) & 15 to the address before every copy.)
template <int PF>
__device__ __forceinline__ void cp_async16_in(uint32_t dst, const void* src, bool in) {
  static_assert(PF == 0 || PF == 64 || PF == 128 || PF == 256, "L2 prefetch sizes: 64, 128, 256 bytes");
#define TVG_CP_ASYNC_IN(L2) \
  asm volatile("{\n.reg .pred ig;\nsetp.eq.b32 ig, %2, 0;\ncp.async.cg.shared.global" L2 " [%0], [%1], 16, ig;\n}\n" ::"r"(dst), "l"(src), "r"((int)in))
  if constexpr (PF == 0) TVG_CP_ASYNC_IN("");
  if constexpr (PF == 64) TVG_CP_ASYNC_IN(".L2::64B");
  if constexpr (PF == 128) TVG_CP_ASYNC_IN(".L2::128B");
  if constexpr (PF == 256) TVG_CP_ASYNC_IN(".L2::256B");
#undef TVG_CP_ASYNC_IN
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// generic-proxy shared-memory writes (cp.async, st.shared) before wgmma reads them (async proxy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void st_shared_u32(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
}
// The dynamic shared memory as a Smem struct, its base rounded up to 1024 bytes (the swizzle pattern
// is keyed to 1024-byte address bits; the host adds the slack).
template <class Smem>
__device__ __forceinline__ Smem& aligned_smem() {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t raw = smem_u32(smem);
  return *reinterpret_cast<Smem*>(smem + (((raw + 1023u) & ~1023u) - raw));
}

// The dynamic shared memory as a Smem struct that takes all of it (no slack): the base must
// already be 1024-byte aligned, and a kernel stops here if it is not.
template <class Smem>
__device__ __forceinline__ Smem& exact_smem() {
  extern __shared__ __align__(1024) unsigned char smem[];
  if (smem_u32(smem) & 1023u) __trap();
  return *reinterpret_cast<Smem*>(smem);
}

// Stage ablations (TV_SKIP, a -D bitmask; specdiag.bench.ablation): Q K^T, both P V halves, the
// mask and softmax, every tile's cp.async (the loader still announces each part), the page-table
// reads (prefix token n from pool row n), the mask alone (every tile taken as a whole prefix
// tile). Results wrong by design.
#ifndef TV_SKIP
#define TV_SKIP 0
#endif
enum Skip : int { kSkipQK = 1, kSkipPV = 2, kSkipSoftmax = 4, kSkipLoads = 8, kSkipPages = 16, kSkipMask = 32 };
__host__ __device__ constexpr bool runs(Skip stage) { return (TV_SKIP & stage) == 0; }

// TV_TRACE=1 builds: the clock64() buffer a kernel's trace events fill, [who][tile][slot] with row
// TRACE_TILES for whole-kernel events (read by specdiag.bench.trace)
#ifndef TV_TRACE
#define TV_TRACE 0
#endif
constexpr int TRACE_TILES = 128, TRACE_SLOTS = 16;
#if TV_TRACE
extern "C" __device__ unsigned long long tv_trace[3][TRACE_TILES + 1][TRACE_SLOTS];
__device__ unsigned long long tv_trace[3][TRACE_TILES + 1][TRACE_SLOTS];
#endif
__device__ __forceinline__ void trace_clock(int who, int row, int slot) {
#if TV_TRACE
  tv_trace[who][row][slot] = clock64();
#endif
}
// the global timer (ns), the same on every SM
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
// trace_clock with the global timer: two of each on one SM give its clock rate
__device__ __forceinline__ void trace_ns(int who, int row, int slot) {
#if TV_TRACE
  tv_trace[who][row][slot] = global_ns();
#endif
}

// TV_TRACE=1 builds, every CTA (the first TRACE_CTAS in launch order): slot 0 its SM + 1, then
// each math warpgroup's KernelEvent e in global ns at 1 + 3 who + e (read by specdiag.bench.trace)
constexpr int TRACE_CTAS = 2048, CTA_SLOTS = 8;
#if TV_TRACE
extern "C" __device__ unsigned long long tv_ctas[TRACE_CTAS][CTA_SLOTS];
__device__ unsigned long long tv_ctas[TRACE_CTAS][CTA_SLOTS];
#endif
__device__ __forceinline__ void trace_cta(int who, int e) {
#if TV_TRACE
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= TRACE_CTAS || who > 1) return;
  tv_ctas[cta][1 + 3 * who + e] = global_ns();
  if (who == 0 && e == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    tv_ctas[cta][0] = sm + 1;
  }
#endif
}

// a compile-time int as a value (a lambda's `auto` argument that its body uses as a constant)
template <int V>
struct Const {
  static constexpr int value = V;
};

// Named barriers (ids 1..15; 0 is __syncthreads), every kernel's in this one list; the kernels
// run in separate CTAs, so their ids may coincide.
enum NamedBarrier : int {
  kBarEmpty0 = 1,  // seesaw: stage 0 free (math warpgroups arrive, the loader waits)
  kBarEmpty1 = 2,  // seesaw: stage 1 free
  kBarP0 = 3,      // seesaw: P, alpha and max of an even tile handed to the other math warpgroup
  kBarP1 = 4,      // seesaw: the same for an odd tile
  kBarMath = 5,    // seesaw: both math warpgroups, the epilogue's row-sum exchange
  kBarPairMax0 = 8,    // seesaw, TV_PAIR: warpgroup 0's max after its tile of the pair
  kBarPairMax1 = 9,    // seesaw, TV_PAIR: the pair's max (warpgroup 1)
  kBarPairFreeE0 = 10,  // seesaw, TV_PAIR: an even tile's early column blocks free (its owner's V half)
  kBarPairFreeE1 = 11,  // seesaw, TV_PAIR: the same for an odd tile
  kBarPairFreeL0 = 12,  // seesaw, TV_PAIR: an even tile's late column blocks free (the other's V half, P)
  kBarPairFreeL1 = 13,  // seesaw, TV_PAIR: the same for an odd tile
  kBarWideLanded = 1,  // wide, + 3 stage + part: that part of the stage's tile landed (loader -> wg0)
  kBarWideFree = 7,    // wide, + stage: both P V of the stage's tile done (wg0, wg1 -> loader)
  kBarWidePReady = 9,  // wide, + stage: P^T of the stage's tile, its factors and the "moved" flag out (wg0 -> wg1)
  kBarWideWg0 = 11,    // wide: warpgroup 0 alone (the per-tile vote, P^T's stores, its epilogue's half of O^T)
  kBarWideSums = 12,   // wide: the final max and sums out (wg0 -> wg1)
  kBarWideWg1 = 13,    // wide: warpgroup 1 alone (its epilogue's half of O^T in shared memory)
};
// named barrier `id` over `count` threads: arrive does not wait
__device__ __forceinline__ void bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
// bar_sync that also ORs `pred` over the `count` threads and returns it to each
__device__ __forceinline__ bool bar_red_or(int id, int count, bool pred) {
  int r;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.b32 %0, 1, 0, q;\n}\n"
               : "=r"(r) : "r"((int)pred), "r"(id), "r"(count) : "memory");
  return r != 0;
}

// A tile's three cp.async groups (parts) announced on named barriers first_id .. first_id + 2
// (`count` threads: these arrive, the part's reader syncs), each once this thread's copies of it
// have landed; L groups were committed after the tile's.
template <int L>
__device__ __forceinline__ void announce_parts(int first_id, int count, int first_count = -1) {
  cp_async_wait<L + 2>();
  fence_proxy_async();  // the copies are read by wgmma (async proxy)
  bar_arrive(first_id, first_count < 0 ? count : first_count);
  cp_async_wait<L + 1>();
  fence_proxy_async();
  bar_arrive(first_id + 1, count);
  cp_async_wait<L>();
  fence_proxy_async();
  bar_arrive(first_id + 2, count);
}

// st_shared_u32 if `pred`, as a predicated store (no branch for the compiler to keep)
__device__ __forceinline__ void st_shared_u32_if(uint32_t dst, uint32_t v, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.shared.u32 [%0], %1;\n}\n" ::"r"(dst), "r"(v), "r"((int)pred) : "memory");
}
// two floats from shared memory at `addr` (8-byte aligned) if `pred`, else zeros and no access
__device__ __forceinline__ float2 ld_shared_f2_if(uint32_t addr, bool pred) {
  float2 v;
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\nmov.f32 %0, 0f00000000;\nmov.f32 %1, 0f00000000;\n"
               "@p ld.shared.v2.f32 {%0, %1}, [%2];\n}\n"
               : "=f"(v.x), "=f"(v.y) : "r"(addr), "r"((int)pred) : "memory");
  return v;
}

// ROWS token rows into the swizzled layout at `dst` with cp.async by THREADS threads (t = this
// thread's index among them): 9 chunks of each of its ROWS / (THREADS / 8) rows. src(i, p, bytes):
// row i's first element, and 16 bytes, or 0 to zero-fill.
template <int ROWS, int THREADS, typename Src>
__device__ __forceinline__ void load_rows(uint32_t dst, int t, Src src) {
  static_assert(ROWS % (THREADS / 8) == 0, "whole rows per pass");
#pragma unroll
  for (int i = 0; i < ROWS / (THREADS / 8); ++i) {
    const int row = load_row<THREADS>(t, i);
    const __nv_bfloat16* p;
    int bytes;
    src(row, p, bytes);
#pragma unroll
    for (int c = 0; c < 9; ++c) {
      const int chunk = load_chunk(t, c);
      cp_async16(dst + tile_offset(ROWS, row, chunk), p + chunk * 8, bytes);
    }
  }
}

// The CTA's ROWS query rows from row0 on into Q's swizzled tile at `dst` by THREADS threads
// (load_rows); rows past R are zero-filled.
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_q(const tv::VerifyParams& p, uint32_t dst, int t, int b, int row0) {
  load_rows<ROWS, THREADS>(dst, t, [&](int r, const __nv_bfloat16*& src, int& bytes) {
    const int gr = row0 + r;
    src = p.q + ((size_t)b * p.R + min(gr, p.R - 1)) * tv::D;
    bytes = gr < p.R ? 16 : 0;
  });
}

// Where a split's key rows are: the pool and its page size, or the request's tree nodes as pages
// of one row; `base` already at this thread's first chunk load_chunk(t, 0)
struct KeySource {
  const __nv_bfloat16* base;
  int page_size;
};
__device__ __forceinline__ KeySource key_source(const tv::VerifyParams& p, const tvc::SplitWork& w, int t, int b) {
  const __nv_bfloat16* base = w.is_tree ? p.tree_kv + (size_t)b * p.T * tv::D : p.kv_pool;
  return {base + load_chunk(t, 0) * 8, w.is_tree ? 1 : tvc::page_size(p)};
}
// This thread's rows load_row<THREADS>(t, i) of a ROWS-key tile from key tok0 of its split's part:
// each row's page and its row in the page, read a load ahead of the copies (with page size 1 every
// row is its own page-table entry). A row past the part takes key 0's (key_in: its copies zero-fill).
// (kSkipPages: the page table left unread, key n's page taken as n's page index.)
template <int N>
struct KeyPages {
  int page[N];
  int off[N];
};
template <int ROWS, int THREADS>
__device__ __forceinline__ void key_pages(const tv::VerifyParams& p, const tvc::SplitWork& w, int tok0, int t, int b,
                                          KeyPages<ROWS / (THREADS / 8)>& k) {
  // (a tree split reads its request's prefix length where a page-table entry would be: a valid
  // address for every split, so the reads are written without a predicate, and the value goes
  // unused; ptxas still puts the split's kind on them)
  const int* entries = w.is_tree ? p.prefix_lens + b : p.page_table + (size_t)b * p.max_pages;
#pragma unroll
  for (int i = 0; i < ROWS / (THREADS / 8); ++i) {
    const int tok = tok0 + load_row<THREADS>(t, i);
    const int tk = tok < w.kv_len ? tok : 0;
    const int pk = w.is_tree ? 0 : tk;
    const int pi = tvc::page_of(p, pk);
    const int page = runs(kSkipPages) ? __ldg(entries + pi) : pi;
    k.page[i] = w.is_tree ? tk : page;
    k.off[i] = pk - pi * tvc::page_size(p);
  }
}
// row i's first element at this thread's first chunk
template <int N>
__device__ __forceinline__ const __nv_bfloat16* key_ptr(const KeySource& s, const KeyPages<N>& k, int i) {
  return s.base + (size_t)(k.page[i] * s.page_size + k.off[i]) * tv::D;
}
// whether this thread's row i of the ROWS-key tile from key tok0 is in its split's part
template <int THREADS>
__device__ __forceinline__ bool key_in(const tvc::SplitWork& w, int tok0, int t, int i) {
  return (THREADS / 8) * i < w.kv_len - tok0 - load_row<THREADS>(t, 0);
}

// One loader thread (t of WG) of a split's BN-key tiles: where its rows come from, each tile's
// pages (read a load ahead), and its copies, each at the thread's first (row, chunk) plus a
// compile-time step (rows WG / 8 apart keep their swizzle, column blocks are BN * 128 bytes apart)
template <int BN, int WG>
struct KeyLoader {
  static constexpr int ROWS = BN / (WG / 8);  // rows of a tile per thread
  using Pages = KeyPages<ROWS>;
  const tv::VerifyParams& p;
  const tvc::SplitWork& w;
  const int t, b;
  const KeySource src;
  const uint32_t dst_t;
  TVG_HD static constexpr uint32_t first(int t) { return tile_offset(BN, load_row<WG>(t, 0), load_chunk(t, 0)); }
  TVG_HD static constexpr uint32_t step(int i, int cb) { return (uint32_t)(i * (WG / 8) * 128 + cb * BN * 128); }
  __device__ __forceinline__ KeyLoader(const tv::VerifyParams& p_, const tvc::SplitWork& w_, int t_, int b_)
      : p(p_), w(w_), t(t_), b(b_), src(key_source(p_, w_, t_, b_)), dst_t(first(t_)) {}
  __device__ __forceinline__ void pages(int tile, Pages& k) const { key_pages<BN, WG>(p, w, (w.tile_begin + tile) * BN, t, b, k); }
  // column blocks cb0 .. cb0 + NB - 1 of this thread's rows of `tile` into the tile at `dst`
  template <int PF, int NB>
  __device__ __forceinline__ void copy(uint32_t dst, int tile, const Pages& k, int cb0) const {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const __nv_bfloat16* row = key_ptr(src, k, i);
      const bool in = key_in<WG>(w, (w.tile_begin + tile) * BN, t, i);
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        const int cb = cb0 + j;
        if constexpr (runs(kSkipLoads)) cp_async16_in<PF>(dst + dst_t + step(i, cb), row + 64 * cb, in);
      }
    }
  }
};

// mbarriers (plain sm_90): init (one thread, then mbar_fence_init and a CTA barrier) and the
// wait for phase `parity` to complete
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// arrive on `bar` once every cp.async this thread issued so far has landed (counts as one of
// the arrivals the barrier was initialised with)
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// a warpgroup's register budget per thread (sm_90a; all 128 threads, warp-aligned): the
// warp-specialised kernels give the loads' warpgroup few and the math's many
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// keeps the compiler from moving accumulator reads/writes across the asynchronous MMA
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
// fence_operand over a whole register array (an accumulator, a set of fragments)
template <typename T, int N>
__device__ __forceinline__ void fence_operands(T (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(x[i]);
}

// S[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

// S[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_qk64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// O[64 x 256] += P[64 x 16] (registers) * V[16 x 256] (shared memory, MN-major: transposed B).
__device__ __forceinline__ void wgmma_pv(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// O[64 x 256] += P[64 x 16] (shared memory, K-major) * V[16 x 256] (shared memory, MN-major).
__device__ __forceinline__ void wgmma_pv_ss(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}

// D[64 x 72] (+)= A[64 x 16] B[16 x 72], both from shared memory, B K-major; A MN-major (the
// transposed tile) with A_MN, else K-major.
template <int A_MN = 1>
__device__ __forceinline__ void wgmma_t72(float (&d)[36], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}, %36, %37, p, 1, 1, %39, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
      : "l"(da), "l"(db), "r"(accumulate), "n"(A_MN));
}

}  // namespace tvg
