// Host-side check of the Hopper kernels' shared-memory layout arithmetic (runs on a CPU).
//
// Includes the kernel sources (entry points left out) and checks, with the kernels' own helpers:
//   1. the cp.async assignment copies every 16-byte chunk of a 32- or 64-row tile exactly once,
//      each quarter-warp reading 128 contiguous bytes of one token row and writing one whole
//      128-byte shared row (all 32 banks, no conflict);
//   2. every wgmma descriptor, decoded with the PTX ISA canonical 128-byte-swizzle layouts
//      (T = 8 bf16 per 16 bytes)
//        K-major  Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T))
//        MN-major Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))
//      addresses exactly the element the math needs: Q[m][d] and K[n][d] for S = Q K^T, and
//      V[key][col] for O = P V;
//   3. the partial-S exchange of tree_verify_common.cuh is free of bank conflicts;
//   4. for the seesaw kernel: its tiles and Q loaded by the loader warpgroup (128 threads), Q K^T
//      over all 576 dims, both P V halves, and P's trip through shared memory (each stage's P in
//      the stage's rope block, dims 512..575, which V never reads): where a math warpgroup stores
//      each P value from its accumulator layout is where the K-major descriptor of both P V
//      halves reads P[row][key], free of bank conflicts;
//   5. for the wide kernel (keys in M, 72 query rows in N): S^T's B = Q, V^T read
//      MN-major, and P^T: where warpgroup 0 stores each value (after its lane-pair swap) is where
//      the no-swizzle K-major descriptor reads P^T[row][key], in the stage's rope block and tail,
//      never where V^T is read; and each column's tree-mask node (a float product) against
//      integer division.
// Exit status 0 when everything holds; the first mismatches are printed otherwise.
#define TV_LAYOUT_ONLY
#include "../../kernels/tree_verify_wgmma.cu"
#include "../../kernels/tree_verify_seesaw.cu"
#include "../../kernels/tree_verify_wide.cu"

#include <cstddef>
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
        expect((base + off) / 1024 == (base + tile_offset(ROWS, row & ~7, chunk & ~7)) / 1024, "8-row group inside one swizzle atom", ROWS, row, chunk, 0);
        if (off < (uint32_t)(ROWS * CH * 16)) at[off / 16] += 1;
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

// The Hopper loaders' copies (tvg::KeyLoader: the thread's first chunk plus a compile-time step)
// land where check_loads' assignment puts them.
template <int ROWS, int THREADS>
static void check_loader_steps() {
  using L = tvg::KeyLoader<ROWS, THREADS>;
  for (int t = 0; t < THREADS; ++t)
    for (int i = 0; i < L::ROWS; ++i)
      for (int c = 0; c < NB; ++c)
        expect(L::first(t) + L::step(i, c) == tile_offset(ROWS, tvg::load_row<THREADS>(t, i), load_chunk(t, c)),
               "loader copy at its first chunk plus the step", ROWS, t, i, c);
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


// The seesaw kernel (tree_verify_seesaw.cu): Q K^T over all 36 k-steps, P V halves 0 and 1, and
// P in each stage's rope block. W: the kernel's namespace constants and layout helpers.
template <class W>
static void check_seesaw(int p_buffers, uint32_t p_buf_bytes) {
  const uint32_t q_base = 1024, k_base = 1024 + W::Q_B + (W::STAGES - 1) * W::TILE_B;
  check_loads<W::BN, W::WG>(k_base);         // a key tile, by one warpgroup
  check_loader_steps<W::BN, W::WG>();
  check_loads<W::BM, W::Q_THREADS>(q_base);  // Q, by the loader warpgroup
  for (int ks = 0; ks < W::KSTEPS; ++ks) {
    const uint64_t da = tvg::kstep_desc(q_base, W::BM, ks), db = tvg::kstep_desc(k_base, W::BN, ks);
    for (int k = 0; k < 16; ++k) {
      for (int m = 0; m < W::BM; ++m) expect(k_major(da, m, k) == element(q_base, W::BM, m, 16 * ks + k), "seesaw QK A = Q[m][dim]", ks, m, k, 0);
      for (int n = 0; n < W::BN; ++n) expect(k_major(db, n, k) == element(k_base, W::BN, n, 16 * ks + k), "seesaw QK B = K[n][dim]", ks, n, k, 0);
    }
  }
  for (int wg = 0; wg < 2; ++wg)
    for (int kk = 0; kk < W::BN / 16; ++kk) {
      const uint64_t db = W::v_desc(k_base, wg, kk);
      expect(start_of(db) % 1024 == 0, "seesaw PV descriptor starts on a swizzle atom", wg, kk, 0, 0);
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < W::VH; ++n)
          expect(mn_major(db, n, k) == element(k_base, W::BN, 16 * kk + k, wg * W::VH + n), "seesaw PV B = V[key][col]", wg, kk, n, k);
      // (the seesaw kernel's P sits in the same stage: V is never read from where P is)
      for (int x = 0; x < p_buffers; ++x)
        for (int k = 0; k < 16; ++k)
          for (int n = 0; n < W::VH; ++n) {
            const uint32_t v = mn_major(db, n, k), buf = W::p_buf(1024 + W::Q_B, x, p_buf_bytes);
            expect(v < buf || v >= buf + (uint32_t)(W::BM * W::BN * 2), "seesaw PV reads V outside P", wg, kk, n, x);
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
              expect(k_major_interleave(W::p_desc(buf, key / 16), r, key % 16) == buf + off + 2 * e, "seesaw PV A = P[row][key]", x, r, key, 0);
            }
          }
        }
  }
  for (int i = 0; i < W::BM * W::BN; ++i) expect(stored[i] == 1, "every P element stored once", i / W::BN, i % W::BN, stored[i], 0);
}

struct Seesaw {
  static constexpr int BM = tvsee::BM, BN = tvsee::BN, WG = tvsee::WG, KSTEPS = tvsee::KSTEPS, VH = tvsee::VH;
  static constexpr int Q_THREADS = tvsee::WG;  // the loader warpgroup
  static constexpr int Q_B = tvsee::Q_B, TILE_B = tvsee::TILE_B, STAGES = tvsee::STAGES;
  static uint32_t p_buf(uint32_t stages, int x, uint32_t) { return tvsee::p_buf(stages + x * tvsee::TILE_B); }
  static uint64_t p_desc(uint32_t buf, int kk) { return tvsee::p_desc(buf, kk); }
  static uint32_t p_offset(int r, int nt, int t4) { return tvsee::p_offset(r, nt, t4); }
  static uint64_t v_desc(uint32_t base, int wg, int kk) { return tvsee::v_desc(base, wg, kk); }
};

// The wide kernel (tree_verify_wide.cu), stage 1 of its Smem at byte 0.
static void check_wide() {
  using tvwide::BN, tvwide::Epilogue, tvwide::KSTEPS, tvwide::MB, tvwide::NQ, tvwide::PT_B;
  using tvwide::pt_buf, tvwide::pt_desc, tvwide::pt_offset, tvwide::Q_B, tvwide::q_desc, tvwide::ROPE_OFF, tvwide::Smem;
  using tvwide::STAGE_B, tvwide::vt_desc, tvwide::WG;
  const uint32_t q_base = 0, k_base = Q_B + STAGE_B;
  expect(sizeof(Smem) == 232448 && offsetof(Smem, stage) == (size_t)Q_B, "wide: Q and two stages fill 227 KB", (int)sizeof(Smem), 0, 0, 0);
  expect(STAGE_B % 1024 == 0 && pt_buf(k_base) + PT_B == k_base + STAGE_B, "wide: P^T ends where the stage does", STAGE_B, 0, 0, 0);
  check_loads<BN, WG>(k_base);  // a key tile, by the loader warpgroup
  check_loader_steps<BN, WG>();
  std::vector<int> q_seen(NQ * 72, 0);
  for (int idx = 0; idx < NQ * 72; ++idx) {  // Q, by the loader's 128 threads in the kernel's order
    const int r = idx / 72, chunk = idx % 72;
    const uint32_t off = tile_offset(NQ, r, chunk);
    expect(off % 16 == 0 && off < (uint32_t)Q_B, "wide: Q chunk inside Q", r, chunk, 0, 0);
    q_seen[off / 16] += 1;
  }
  for (int i = 0; i < NQ * 72; ++i) expect(q_seen[i] == 1, "wide: every Q chunk once", i, q_seen[i], 0, 0);
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const uint64_t da = kstep_desc(k_base, BN, ks);
    for (int k = 0; k < 16; ++k) {
      for (int m = 0; m < BN; ++m) expect(k_major(da, m, k) == element(k_base, BN, m, 16 * ks + k), "wide S^T A = K[key][dim]", ks, m, k, 0);
      const uint64_t db = q_desc(q_base, ks);
      for (int n = 0; n < NQ; ++n) expect(k_major(db, n, k) == element(q_base, NQ, n, 16 * ks + k), "wide S^T B = Q[row][dim]", ks, n, k, 0);
    }
  }
  const uint32_t buf = pt_buf(k_base);
  for (int wg = 0; wg < 2; ++wg)
    for (int mb = 0; mb < MB; ++mb)
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint64_t da = vt_desc(k_base, wg, mb, kk), db = pt_desc(buf, kk);
        expect(start_of(da) % 1024 == 0 && (db >> 62) == 0, "wide P V: A on a swizzle atom, B unswizzled", wg, mb, kk, 0);
        for (int k = 0; k < 16; ++k) {
          for (int m = 0; m < 64; ++m) {
            const uint32_t a = mn_major(da, m, k);
            expect(a == element(k_base, BN, 16 * kk + k, 256 * wg + 64 * mb + m), "wide P V A = V[key][dim]", wg, mb, kk, m);
            expect(a < buf || a >= buf + PT_B, "wide P V reads V outside P^T", wg, mb, kk, m);
          }
          for (int n = 0; n < NQ; ++n)
            expect(k_major_interleave(db, n, k) == buf + pt_offset(n, 16 * kk + k), "wide P V B = P^T[row][key]", kk, n, k, 0);
        }
      }
  // P^T stores: thread (warp w4, g, t4) holds keys 16 w4 + g (+ 8) of columns 8 i + 2 t4 (+ 1);
  // lanes g and g ^ 1 swap one value, the even one storing column 2 t4's key pair, the odd one 2 t4 + 1's
  std::vector<int> stored(NQ * BN, 0);
  for (int w4 = 0; w4 < 4; ++w4)
    for (int i = 0; i < NQ / 8; ++i)
      for (int h = 0; h < 2; ++h) {
        bool bank[32] = {};
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t4 = lane & 3, key = 16 * w4 + g + 8 * h, n0 = 8 * i + 2 * t4;
          const int n = (g & 1) ? n0 + 1 : n0, k0 = (g & 1) ? key - 1 : key;
          const uint32_t off = pt_offset(n, k0);
          expect(tvwide::pt_thread(16 * w4, g, t4) + pt_offset(8 * i, 8 * h) == off, "wide P^T store: thread base + immediate", w4, i, h, lane);
          expect(off % 4 == 0 && off + 4 <= (uint32_t)PT_B, "wide P^T store inside P^T", n, k0, 0, 0);
          expect(!bank[(off / 4) % 32], "wide P^T store bank-conflict free", w4, i, h, lane);
          bank[(off / 4) % 32] = true;
          stored[n * BN + k0] += 1;
          stored[n * BN + k0 + 1] += 1;
        }
      }
  for (int i = 0; i < NQ * BN; ++i) expect(stored[i] == 1, "wide: every P^T element stored once", i / BN, i % BN, stored[i], 0);
  expect(4 * NQ * 4 <= ROPE_OFF && sizeof(Epilogue) <= (size_t)STAGE_B, "wide: scratch fits", 0, 0, 0, 0);
  // each column's node for the tree mask, as the kernel takes it, against integer division
  for (int H = 1; H <= 512; ++H)
    for (int T : {1, 2, 3, 9, 65, 257, 1024})
      for (int row0 = 0, R = T * H; row0 < R; row0 += NQ)
        for (int col = 0; col < NQ; ++col) {
          const int row = row0 + col < R - 1 ? row0 + col : R - 1;
          expect(tvwide::column_node(row0 + col, R, H, row0 / H, 1.f / H) == row / H, "wide: a column's node", H, T, row0, col);
        }
}

int main() {
  check_wide();
  const uint32_t q_base = 1024, k_base = 1024 + Q_B + 2 * TILE_B;  // 1024-aligned, the last stage
  check_exchange_banks();
  check_loads<BN>(k_base);
  check_loads<BM>(q_base);
  check_seesaw<Seesaw>(2, tvsee::P_B);  // one P per stage
  expect(tvsee::p_buf(0) == (uint32_t)tvg::tile_offset(tvsee::BN, 0, 64), "seesaw: P in column block 8 (dims 512..575)", tvsee::p_buf(0), 0, 0, 0);
  expect(offsetof(tvsee::Smem, stage) % 1024 == 0 && sizeof(tvsee::Smem::stage[0]) % 1024 == 0, "seesaw: stages on swizzle atoms", 0, 0, 0, 0);
  expect(offsetof(tvw::Smem, k) % 1024 == 0 && sizeof(tvw::Smem::k[0]) % 1024 == 0, "wgmma: stages on swizzle atoms", 0, 0, 0, 0);
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
  // desc_add (the kernels' per-k-step descriptors: one per operand plus the step's bytes) is the
  // descriptor of the moved address, for every 16-byte address and step inside 227 KB...
  for (uint32_t a = 0; a < 227 * 1024; a += 16)
    for (uint32_t off : {16u, 32u, 256u, 2048u, 8192u, 73728u, 147456u})
      if (a + off < 227 * 1024) {
        expect(desc_add(make_desc(a, 16, 1024), off) == make_desc(a + off, 16, 1024), "desc_add: swizzled", a, off, 0, 0);
        expect(desc_add(make_desc_interleave(a, 128, 1024), off) == make_desc_interleave(a + off, 128, 1024), "desc_add: interleave", a, off, 0, 0);
      }
  // ...and, as the seesaw and wide kernels write them, each k-step's descriptors in every stage
  for (int st = 0; st < tvsee::STAGES; ++st) {
    const uint32_t sq = 1024, sk = sq + tvsee::Q_B + st * tvsee::TILE_B;
    const uint64_t dq = kstep_desc(sq, tvsee::BM, 0), dk = kstep_desc(sk, tvsee::BN, 0);
    for (int ks = 0; ks < tvsee::KSTEPS; ++ks)
      expect(desc_add(dq, kstep_offset(tvsee::BM, ks)) == kstep_desc(sq, tvsee::BM, ks) &&
                 desc_add(dk, kstep_offset(tvsee::BN, ks)) == kstep_desc(sk, tvsee::BN, ks),
             "seesaw: Q K^T's k-step descriptors", st, ks, 0, 0);
    for (int c = 0; c < 2; ++c)
      for (int kk = 0; kk < tvsee::BN / 16; ++kk)
        expect(desc_add(tvsee::v_desc(sk, c, 0), tvsee::V_KSTEP * kk) == tvsee::v_desc(sk, c, kk) &&
                   desc_add(tvsee::p_desc(tvsee::p_buf(sk), 0), tvsee::P_KSTEP * kk) == tvsee::p_desc(tvsee::p_buf(sk), kk),
               "seesaw: P V's k-step descriptors", st, c, kk, 0);
  }
  for (int st = 0; st < tvwide::STAGES; ++st) {
    const uint32_t sq = offsetof(tvwide::Smem, q), sk = offsetof(tvwide::Smem, stage) + st * tvwide::STAGE_B;
    for (int ks = 0; ks < tvwide::KSTEPS; ++ks)
      expect(desc_add(kstep_desc(sk, tvwide::BN, 0), kstep_offset(tvwide::BN, ks)) == kstep_desc(sk, tvwide::BN, ks) &&
                 desc_add(tvwide::q_desc(sq, 0), kstep_offset(tvwide::NQ, ks)) == tvwide::q_desc(sq, ks),
             "wide: S^T's k-step descriptors", st, ks, 0, 0);
    for (int c = 0; c < 2; ++c)
      for (int mb = 0; mb < tvwide::MB; ++mb)
        for (int kk = 0; kk < tvwide::BN / 16; ++kk)
          expect(desc_add(tvwide::vt_desc(sk, c, 0, 0), tvwide::VT_BLOCK * mb + tvwide::VT_KSTEP * kk) == tvwide::vt_desc(sk, c, mb, kk) &&
                     desc_add(tvwide::pt_desc(tvwide::pt_buf(sk), 0), tvwide::PT_KSTEP * kk) == tvwide::pt_desc(tvwide::pt_buf(sk), kk),
                 "wide: P V's descriptors", st, c, mb, kk);
  }
  // the 14-bit descriptor fields hold the largest addresses and strides used
  expect(start_of(make_desc(SMEM_BYTES - 16, BN * 128, 1024)) == (uint32_t)(SMEM_BYTES - 16), "start fits", SMEM_BYTES, 0, 0, 0);
  expect(lbo_of(make_desc(0, BN * 128, 1024)) == (uint32_t)(BN * 128), "lbo fits", BN * 128, 0, 0, 0);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("wgmma layout (wgmma, seesaw and wide kernels): all checks passed\n");
  return 0;
}
