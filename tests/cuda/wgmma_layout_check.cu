// Host-side check of the wgmma kernel's shared-memory layout arithmetic (runs on a CPU).
//
// Includes the kernel source itself (kernel entry left out) and checks, with the kernel's own
// helpers, that
//   1. the cp.async assignment copies every 16-byte chunk of a 32- or 64-row tile exactly once,
//      each quarter-warp reading 128 contiguous bytes of one token row and writing one whole
//      128-byte shared row (all 32 banks, no conflict), and that this is the same place a TMA
//      box with 128-byte swizzle writes the chunk (swizzle applied to the absolute address:
//      16-byte chunk bits 4-6 XOR 128-byte row bits 7-9, blocks 1024-byte aligned);
//   2. every wgmma descriptor, decoded with the PTX ISA / CUTLASS canonical 128-byte-swizzle
//      layouts (T = 8 bf16 per 16 bytes)
//        K-major  Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T))
//        MN-major Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))
//      addresses exactly the element the math needs: Q[m][d] and K[n][d] for S = Q K^T over
//      the warpgroup's head dims, and V[key][col] for O = P V over its output columns;
//   3. the partial-S exchange of tree_verify_common.cuh is free of bank conflicts;
//   4. for the warp-specialised kernel (tree_verify_mla_ws.cu): its tiles loaded by one
//      warpgroup (128 threads) and Q by both, its Q K^T over all 576 dims, both P V halves, and
//      P's trip through shared memory (two buffers, no-swizzle core-matrix layout): where
//      warpgroup 0 stores each P value from its accumulator layout is where the K-major
//      descriptor of both warpgroups' P V reads P[row][key], and those stores are free of bank
//      conflicts;
//      The same for the 64-key warp-specialised kernel (tree_verify_mla_ws64.cu, one P buffer)
//      and for the seesaw kernel (tree_verify_mla_seesaw.cu: Q by its loader warpgroup, each
//      stage's P in the stage's rope block, dims 512..575, which V never reads);
//   5. for the transposed kernel (tree_verify_mla_t.cu): its 64-key tiles loaded by one
//      warpgroup and its 40-row Q by both, S^T = K Q^T (A = the key tile, B = Q) over all 576
//      dims, V^T P^T with A = the tile read MN-major (each warpgroup's four 64-dim blocks) and
//      B = P^T: where warpgroup 0 stores each P value (after the lane-pair swap) is where the
//      K-major descriptor reads P^T[row][key], every element once, free of bank conflicts.
// Exit status 0 when everything holds; the first mismatches are printed otherwise.
#define TVW_LAYOUT_ONLY
#include "../../kernels/tree_verify_mla_wgmma.cu"
#include "../../kernels/tree_verify_mla_ws.cu"
#include "../../kernels/tree_verify_mla_ws64.cu"
#include "../../kernels/tree_verify_mla_t.cu"
#include "../../kernels/tree_verify_mla_seesaw.cu"

#include <cstdio>
#include <vector>

using namespace tvw;

static uint32_t start_of(uint64_t d) { return (uint32_t)(d & 0x3FFF) << 4; }
static uint32_t lbo_of(uint64_t d) { return (uint32_t)((d >> 16) & 0x3FFF) << 4; }
static uint32_t sbo_of(uint64_t d) { return (uint32_t)((d >> 32) & 0x3FFF) << 4; }
static uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7) << 4); }
static uint32_t k_major(uint64_t d, int mn, int k) {
  return swizzle128(start_of(d) + (mn % 8) * 128 + (mn / 8) * sbo_of(d) + k * 2);
}
// the no-swizzle ("interleave") K-major layout: 8 x 16-byte core matrices, LBO along K, SBO along M/N
static uint32_t k_major_interleave(uint64_t d, int mn, int k) {
  return start_of(d) + (mn % 8) * 16 + (mn / 8) * sbo_of(d) + (k % 8) * 2 + (k / 8) * lbo_of(d);
}
static uint32_t mn_major(uint64_t d, int mn, int k) {
  return swizzle128(start_of(d) + (mn % 64) * 2 + (mn / 64) * lbo_of(d) + (k % 8) * 128 + (k / 8) * sbo_of(d));
}
// where the loads put element (row, col) of a tile of `rows` 576-wide token rows
static uint32_t element(uint32_t base, int rows, int row, int col) { return base + tile_offset(rows, row, col / 8) + (col % 8) * 2; }
// where a TMA box (64 dims x rows) with 128-byte swizzle into dst puts box element (row, dim)
static uint32_t tma_box(uint32_t dst, int row, int dim) { return swizzle128(dst + row * 128 + dim * 2); }

static int failures = 0;
static void expect(bool ok, const char* what, int a, int b, int c, int d) {
  if (!ok && failures++ < 5) std::printf("FAIL %s (%d, %d, %d, %d)\n", what, a, b, c, d);
}

template <int ROWS, int THREADS = NT>
static void check_loads(uint32_t base) {
  std::vector<int> seen(ROWS * CH, 0), at(ROWS * CH * 16 / 16, 0);
  const auto load_row = [](int t, int i) { return tvg::load_row<THREADS>(t, i); };
  constexpr int PASSES = ROWS / (THREADS / 8);
  for (int tid = 0; tid < THREADS; ++tid)
    for (int i = 0; i < PASSES; ++i)
      for (int c = 0; c < NB; ++c) {
        const int row = load_row(tid, i), chunk = load_chunk(tid, c);
        const bool in = row >= 0 && row < ROWS && chunk >= 0 && chunk < CH;
        expect(in, "load in range", ROWS, tid, i, c);
        if (!in) continue;
        seen[row * CH + chunk] += 1;
        const uint32_t off = tile_offset(ROWS, row, chunk);
        expect(off % 16 == 0 && off < (uint32_t)(ROWS * CH * 16), "offset inside the tile", ROWS, row, chunk, off);
        if (off < (uint32_t)(ROWS * CH * 16)) at[off / 16] += 1;
        // the TMA box of column block chunk / 8 (at base + block * ROWS * 128) puts it here too
        expect(base + off == tma_box(base + (chunk / 8) * ROWS * 128, row, (chunk % 8) * 8), "cp.async place == TMA place", ROWS, row, chunk, 0);
      }
  for (int i = 0; i < ROWS * CH; ++i) expect(seen[i] == 1, "chunk copied exactly once", ROWS, i / CH, i % CH, seen[i]);
  for (size_t i = 0; i < at.size(); ++i) expect(at[i] == 1, "shared slot written exactly once", ROWS, (int)i, at[i], 0);
  for (int warp = 0; warp < THREADS / 32; ++warp)
    for (int i = 0; i < PASSES; ++i)
      for (int c = 0; c < NB; ++c)
        for (int quarter = 0; quarter < 4; ++quarter) {
          const int t0 = warp * 32 + quarter * 8;
          const int row = load_row(t0, i), chunk0 = load_chunk(t0, c);
          expect(chunk0 % 8 == 0, "quarter-warp starts a 128-byte run", ROWS, warp, c, quarter);
          bool bank[8] = {};
          for (int j = 0; j < 8; ++j) {
            const int t = t0 + j;
            expect(load_row(t, i) == row && load_chunk(t, c) == chunk0 + j, "quarter-warp reads 128 contiguous bytes of one row", ROWS, warp, c, j);
            const uint32_t off = tile_offset(ROWS, load_row(t, i), load_chunk(t, c));
            expect(off / 128 == tile_offset(ROWS, row, chunk0) / 128, "quarter-warp writes one 128-byte shared row", ROWS, warp, c, j);
            expect(!bank[(off / 16) % 8], "quarter-warp store bank-conflict free", ROWS, warp, c, j);
            bank[(off / 16) % 8] = true;
          }
        }
}

// The partial-S exchange (tree_verify_common.cuh): each float2 store/load of a half-warp
// (lanes g = 0..3 or 4..7, t4 = 0..3; rows g or g + 8 of a warp's 16) touches 32 distinct banks.
static void check_exchange_banks() {
  constexpr int SS = tvc::s_stride<BN>();
  for (int warp_row0 : {0, 16, 32, 48})
    for (int h = 0; h < 2; ++h)
      for (int nt = 0; nt < BN / 8; ++nt)
        for (int half_warp = 0; half_warp < 2; ++half_warp) {
          bool used[32] = {};
          for (int lane = 16 * half_warp; lane < 16 * half_warp + 16; ++lane) {
            const int g = lane >> 2, t4 = lane & 3;
            const int word = (warp_row0 + g + 8 * h) * SS + nt * 8 + 2 * t4;
            for (int w = word; w < word + 2; ++w) {
              expect(!used[w % 32], "exchange access bank-conflict free", warp_row0, h, nt, lane);
              used[w % 32] = true;
            }
          }
        }
}


// The warp-specialised kernels (tree_verify_mla_ws.cu, 32-key tiles and two P buffers;
// tree_verify_mla_ws64.cu, 64-key tiles and one): Q K^T over all 36 k-steps by warpgroup 0, P V
// halves 0 and 1, and P. W: the kernel's namespace constants and layout helpers.
template <class W>
static void check_ws(int p_buffers, uint32_t p_buf_bytes) {
  const uint32_t q_base = 1024, k_base = 1024 + W::Q_B + (W::STAGES - 1) * W::TILE_B;
  check_loads<W::BN, W::WG>(k_base);         // a key tile, by one warpgroup
  check_loads<W::BM, W::Q_THREADS>(q_base);  // Q (ws, ws64: both warpgroups; seesaw: the loader)
  for (int ks = 0; ks < W::KSTEPS; ++ks) {
    const uint64_t da = tvg::kstep_desc(q_base, W::BM, ks), db = tvg::kstep_desc(k_base, W::BN, ks);
    for (int k = 0; k < 16; ++k) {
      for (int m = 0; m < W::BM; ++m) expect(k_major(da, m, k) == element(q_base, W::BM, m, 16 * ks + k), "ws QK A = Q[m][dim]", ks, m, k, 0);
      for (int n = 0; n < W::BN; ++n) expect(k_major(db, n, k) == element(k_base, W::BN, n, 16 * ks + k), "ws QK B = K[n][dim]", ks, n, k, 0);
    }
  }
  for (int wg = 0; wg < 2; ++wg)
    for (int kk = 0; kk < W::BN / 16; ++kk) {
      const uint64_t db = W::v_desc(k_base, wg, kk);
      expect(start_of(db) % 1024 == 0, "ws PV descriptor starts on a swizzle atom", wg, kk, 0, 0);
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < W::VH; ++n)
          expect(mn_major(db, n, k) == element(k_base, W::BN, 16 * kk + k, wg * W::VH + n), "ws PV B = V[key][col]", wg, kk, n, k);
      // (the seesaw kernel's P sits in the same stage: V is never read from where P is)
      for (int x = 0; x < p_buffers; ++x)
        for (int k = 0; k < 16; ++k)
          for (int n = 0; n < W::VH; ++n) {
            const uint32_t v = mn_major(db, n, k), buf = W::p_buf(1024 + W::Q_B, x, p_buf_bytes);
            expect(v < buf || v >= buf + (uint32_t)(W::BM * W::BN * 2), "ws PV reads V outside P", wg, kk, n, x);
          }
    }
  // P (p_buffers buffers, no swizzle): warpgroup 0's thread (warp, g, t4) holds keys 8 nt + 2 t4, +1
  // of rows 16 warp + g and + 8; both warpgroups' P V read it through p_desc
  std::vector<int> stored(W::BM * W::BN, 0);  // P[r][key] stores
  for (int x = 0; x < p_buffers; ++x) {
    const uint32_t buf = W::p_buf(1024 + W::Q_B, x, p_buf_bytes);
    expect(buf % 1024 == 0, "P starts on a swizzle atom", x, buf, 0, 0);
    for (int kk = 0; kk < W::BN / 16; ++kk) expect((W::p_desc(buf, kk) >> 62) == 0, "P descriptor: no swizzle", x, kk, 0, 0);
    for (int warp = 0; warp < 4; ++warp)
      for (int nt = 0; nt < W::BN / 8; ++nt)
        for (int h = 0; h < 2; ++h) {
          bool bank[32] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t4 = lane & 3, r = 16 * warp + g + 8 * h;
            const uint32_t off = W::p_offset(r, nt, t4);
            expect(off % 4 == 0 && off + 4 <= p_buf_bytes, "P store inside its buffer", r, nt, t4, 0);
            expect(!bank[(off / 4) % 32], "P store bank-conflict free", warp, nt, h, lane);
            bank[(off / 4) % 32] = true;
            for (int e = 0; e < 2; ++e) {
              const int key = 8 * nt + 2 * t4 + e;
              if (x == 0) stored[r * W::BN + key] += 1;
              // ...and the K-major descriptor reads P[r][key] from exactly there
              expect(k_major_interleave(W::p_desc(buf, key / 16), r, key % 16) == buf + off + 2 * e, "ws PV A = P[row][key]", x, r, key, 0);
            }
          }
        }
  }
  for (int i = 0; i < W::BM * W::BN; ++i) expect(stored[i] == 1, "every P element stored once", i / W::BN, i % W::BN, stored[i], 0);
}

// the constants and helpers check_ws reads, per kernel
// (P_BUF: buffer x of P given the stages' start; Q_THREADS: the threads that load Q)
#define TVW_WS_TRAITS(NAME, NS, Q_THREADS_, P_BUF)                                                       \
  struct NAME {                                                                                          \
    static constexpr int BM = NS::BM, BN = NS::BN, WG = NS::WG, KSTEPS = NS::KSTEPS, VH = NS::VH;        \
    static constexpr int Q_THREADS = Q_THREADS_;                                                         \
    static constexpr int Q_B = NS::Q_B, TILE_B = NS::TILE_B, STAGES = NS::STAGES;                        \
    static uint32_t p_buf(uint32_t stages, int x, uint32_t bytes) { return P_BUF; }                      \
    static uint64_t p_desc(uint32_t buf, int kk) { return NS::p_desc(buf, kk); }                         \
    static uint32_t p_offset(int r, int nt, int t4) { return NS::p_offset(r, nt, t4); }                  \
    static uint64_t v_desc(uint32_t base, int wg, int kk) { return NS::v_desc(base, wg, kk); }           \
  };
// after the stages (ws, ws64); in stage x's rope block, where Q K^T (x) read dims 512..575 (seesaw)
TVW_WS_TRAITS(Ws, tvws, tvws::NT, stages + tvws::STAGES * tvws::TILE_B + x * bytes)
TVW_WS_TRAITS(Ws64, tvws64, tvws64::NT, stages + tvws64::STAGES * tvws64::TILE_B + x * bytes)
TVW_WS_TRAITS(Seesaw, tvsee, tvsee::WG, tvsee::p_buf(stages + x * tvsee::TILE_B))

// tree_verify_mla_t.cu: keys in M, query rows in N.
static void check_t() {
  namespace X = tvt;
  const uint32_t q_base = 1024, k_base = 1024 + X::Q_B + X::TILE_B, p_base = 1024 + X::Q_B + X::STAGES * X::TILE_B;
  expect(k_base % 1024 == 0 && p_base % 16 == 0, "t: stages on swizzle atoms", k_base, p_base, 0, 0);
  check_loads<X::BN, X::WG>(k_base);  // a 64-key tile, by warpgroup 1 alone
  {  // Q: idx = tid + 256 j over NQ * 72 chunks, each once, at the swizzled place of its element
    std::vector<int> seen(X::NQ * 72, 0);
    for (int tid = 0; tid < X::NT; ++tid)
      for (int idx = tid; idx < X::NQ * 72; idx += X::NT) {
        const int r = idx / 72, chunk = idx % 72;
        seen[idx] += 1;
        expect(q_base + X::q_offset(r, chunk) == element(q_base, X::NQ, r, chunk * 8), "t: Q chunk at its element", r, chunk, 0, 0);
      }
    for (int i = 0; i < X::NQ * 72; ++i) expect(seen[i] == 1, "t: Q chunk copied once", i / 72, i % 72, seen[i], 0);
  }
  for (int ks = 0; ks < X::KSTEPS; ++ks) {
    const uint64_t da = tvg::kstep_desc(k_base, X::BN, ks), db = tvg::kstep_desc(q_base, X::NQ, ks);
    expect((da >> 62) == 1 && (db >> 62) == 1, "t: S^T descriptors use the 128-byte swizzle", ks, 0, 0, 0);
    for (int k = 0; k < 16; ++k) {
      for (int m = 0; m < X::BN; ++m) expect(k_major(da, m, k) == element(k_base, X::BN, m, 16 * ks + k), "t: S^T A = K[key][dim]", ks, m, k, 0);
      for (int n = 0; n < X::NQ; ++n) expect(k_major(db, n, k) == element(q_base, X::NQ, n, 16 * ks + k), "t: S^T B = Q[row][dim]", ks, n, k, 0);
    }
  }
  for (int wg = 0; wg < 2; ++wg)
    for (int mb = 0; mb < X::MB; ++mb)
      for (int kk = 0; kk < X::BN / 16; ++kk) {
        const uint64_t da = X::vt_desc(k_base, wg, mb, kk);
        expect(start_of(da) % 1024 == 0, "t: V^T descriptor starts on a swizzle atom", wg, mb, kk, 0);
        for (int k = 0; k < 16; ++k)
          for (int m = 0; m < 64; ++m)
            expect(mn_major(da, m, k) == element(k_base, X::BN, 16 * kk + k, 256 * wg + 64 * mb + m), "t: PV A = V^T[dim][key]", wg, mb, m, k);
      }
  // P^T: thread (warp w, g, t4) holds keys 16 w + g + 8 h of columns 8 i + 2 t4 + c; after the
  // swap with lane g ^ 1, even g stores (column 8 i + 2 t4, keys key, key + 1), odd g
  // (column 8 i + 2 t4 + 1, keys key - 1, key)
  std::vector<int> stored(X::NQ * X::BN, 0);
  for (int x = 0; x < 2; ++x) {
    const uint32_t buf = p_base + x * X::P_BUF;
    for (int kk = 0; kk < X::BN / 16; ++kk) expect((X::pt_desc(buf, kk) >> 62) == 0, "t: P^T descriptor: no swizzle", x, kk, 0, 0);
    for (int warp = 0; warp < 4; ++warp)
      for (int i = 0; i < X::NI; ++i)
        for (int h = 0; h < 2; ++h) {
          bool bank[32] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t4 = lane & 3, key = 16 * warp + g + 8 * h, n0 = 8 * i + 2 * t4;
            const int col = (g & 1) ? n0 + 1 : n0, key0 = (g & 1) ? key - 1 : key;
            const uint32_t off = (g & 1) ? X::pt_offset(n0 + 1, key - 1) : X::pt_offset(n0, key);
            expect(off % 4 == 0 && off + 4 <= (uint32_t)X::P_BUF, "t: P^T store inside its buffer", col, key0, 0, 0);
            expect(!bank[(off / 4) % 32], "t: P^T store bank-conflict free", warp, i, h, lane);
            bank[(off / 4) % 32] = true;
            for (int e = 0; e < 2; ++e) {
              if (x == 0) stored[col * X::BN + key0 + e] += 1;
              expect(k_major_interleave(X::pt_desc(buf, (key0 + e) / 16), col, (key0 + e) % 16) == buf + off + 2 * e, "t: PV B = P^T[row][key]", x, col, key0 + e, 0);
            }
          }
        }
  }
  for (int i = 0; i < X::NQ * X::BN; ++i) expect(stored[i] == 1, "t: every P^T element stored once", i / X::BN, i % X::BN, stored[i], 0);
  for (int ci = 0; ci < X::COLS; ++ci)
    for (int t4 = 0; t4 < 4; ++t4) expect(X::col_of(ci, t4) == 8 * (ci / 2) + 2 * t4 + ci % 2, "t: column of a thread's index", ci, t4, 0, 0);
}

int main() {
  const uint32_t q_base = 1024, k_base = 1024 + Q_B + 2 * TILE_B;  // 1024-aligned, the last stage
  check_exchange_banks();
  check_loads<BN>(k_base);
  check_loads<BM>(q_base);
  check_ws<Ws>(2, tvws::P_BUF);
  check_ws<Ws64>(1, tvws64::P_B);
  check_ws<Seesaw>(2, tvsee::P_B);  // one P per stage
  expect(tvsee::p_buf(0) == (uint32_t)tvg::tile_offset(tvsee::BN, 0, 64), "seesaw: P in column block 8 (dims 512..575)", tvsee::p_buf(0), 0, 0, 0);
  check_t();
  for (int half = 0; half < 2; ++half)
    for (int ks = 0; ks < KSTEPS / 2; ++ks) {
      const uint64_t da = qk_desc(q_base, BM, half, ks), db = qk_desc(k_base, BN, half, ks);
      expect((da >> 62) == 1 && (db >> 62) == 1, "QK descriptors use the 128-byte swizzle", half, ks, 0, 0);
      for (int k = 0; k < 16; ++k) {
        const int dim = half * (D / 2) + 16 * ks + k;
        for (int m = 0; m < BM; ++m) expect(k_major(da, m, k) == element(q_base, BM, m, dim), "QK A = Q[m][dim]", half, ks, m, k);
        for (int n = 0; n < BN; ++n) expect(k_major(db, n, k) == element(k_base, BN, n, dim), "QK B = K[n][dim]", half, ks, n, k);
      }
    }
  for (int half = 0; half < 2; ++half)
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t db = pv_desc(k_base, half, kk);
      expect(start_of(db) % 1024 == 0, "PV descriptor starts on a swizzle atom", half, kk, 0, 0);
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < VH; ++n)
          expect(mn_major(db, n, k) == element(k_base, BN, 16 * kk + k, half * VH + n), "PV B = V[key][col]", half, kk, n, k);
    }
  // the 14-bit descriptor fields hold the largest addresses and strides used
  expect(start_of(make_desc(SMEM_BYTES - 16, BN * 128, 1024)) == (uint32_t)(SMEM_BYTES - 16), "start fits", SMEM_BYTES, 0, 0, 0);
  expect(lbo_of(make_desc(0, BN * 128, 1024)) == (uint32_t)(BN * 128), "lbo fits", BN * 128, 0, 0, 0);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("wgmma layout (v4, ws, ws64, seesaw and transposed kernels): all checks passed\n");
  return 0;
}
