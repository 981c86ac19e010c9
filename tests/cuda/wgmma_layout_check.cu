// Host-side check of the wgmma kernel's shared-memory layout arithmetic (runs on a CPU).
//
// Includes the kernel source itself (kernel entry left out) and checks, with the kernel's own
// helpers, that
//   1. the cp.async assignment copies every 16-byte chunk of a 32- or 64-row tile exactly once,
//      each quarter-warp writing one 128-byte core matrix and reading 64 contiguous bytes of
//      each of its 8 rows;
//   2. every wgmma descriptor, decoded with the PTX ISA's canonical no-swizzle layouts
//        K-major  ((8,m),(T,2k)):((1T,SBO),(1,LBO))
//        MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))      (T = 8 bf16 per 16 bytes)
//      addresses exactly the element the math needs: Q[m][d] and K[n][d] for S = Q K^T over
//      the warpgroup's head dims, and V[key][col] for O = P V over its output columns;
//   3. the partial-S exchange of tree_verify_common.cuh is free of bank conflicts.
// Exit status 0 when everything holds; the first mismatch is printed otherwise.
#define TVW_LAYOUT_ONLY
#include "../../kernels/tree_verify_mla_wgmma.cu"

#include <cstdio>
#include <vector>

using namespace tvw;

static uint32_t start_of(uint64_t d) { return (uint32_t)(d & 0x3FFF) << 4; }
static uint32_t lbo_of(uint64_t d) { return (uint32_t)((d >> 16) & 0x3FFF) << 4; }
static uint32_t sbo_of(uint64_t d) { return (uint32_t)((d >> 32) & 0x3FFF) << 4; }
static uint32_t k_major(uint64_t d, int mn, int k) {
  return start_of(d) + (mn % 8) * 16 + (mn / 8) * sbo_of(d) + (k % 8) * 2 + (k / 8) * lbo_of(d);
}
static uint32_t mn_major(uint64_t d, int mn, int k) {
  return start_of(d) + (mn % 8) * 2 + (mn / 8) * sbo_of(d) + (k % 8) * 16 + (k / 8) * lbo_of(d);
}
// where the loads put element (row, col) of a tile of 576-wide token rows
static uint32_t element(uint32_t base, int row, int col) { return base + tile_offset(row, col / 8) + (col % 8) * 2; }

static int failures = 0;
static void expect(bool ok, const char* what, int a, int b, int c, int d) {
  if (!ok && failures++ < 5) std::printf("FAIL %s (%d, %d, %d, %d)\n", what, a, b, c, d);
}

template <int ROWS>
static void check_loads() {
  std::vector<int> seen(ROWS * CH, 0);
  for (int tid = 0; tid < NT; ++tid)
    for (int k = 0; k < load_copies<ROWS>(); ++k) {
      const int row = load_row<ROWS>(tid), chunk = load_chunk<ROWS>(tid, k);
      expect(row >= 0 && row < ROWS && chunk >= 0 && chunk < CH, "load in range", ROWS, tid, k, chunk);
      if (row >= 0 && row < ROWS && chunk >= 0 && chunk < CH) seen[row * CH + chunk] += 1;
    }
  for (int i = 0; i < ROWS * CH; ++i) expect(seen[i] == 1, "chunk copied exactly once", ROWS, i / CH, i % CH, seen[i]);
  for (int warp = 0; warp < NT / 32; ++warp)
    for (int k = 0; k < load_copies<ROWS>(); ++k)
      for (int quarter = 0; quarter < 4; ++quarter) {
        const int t0 = warp * 32 + quarter * 8;
        const uint32_t first = tile_offset(load_row<ROWS>(t0), load_chunk<ROWS>(t0, k));
        expect(first % 128 == 0, "quarter-warp writes an aligned core matrix", ROWS, warp, k, quarter);
        for (int j = 0; j < 8; ++j) {
          const int t = t0 + j;
          expect(tile_offset(load_row<ROWS>(t), load_chunk<ROWS>(t, k)) == first + 16 * j, "core matrix contiguous", ROWS, warp, k, j);
          // same row across the four quarters, four consecutive chunks: 64 contiguous global bytes
          expect(load_row<ROWS>(t) == load_row<ROWS>(warp * 32 + j) &&
                     load_chunk<ROWS>(t, k) == load_chunk<ROWS>(warp * 32 + j, k) + quarter,
                 "row read in 64-byte runs", ROWS, warp, k, j);
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

int main() {
  check_exchange_banks();
  check_loads<BN>();
  check_loads<BM>();
  const uint32_t q_base = 1024, k_base = 1024 + Q_B + 2 * TILE_B;  // non-zero, the last stage
  for (int half = 0; half < 2; ++half)
    for (int ks = 0; ks < KH_CH / 2; ++ks) {
      const uint64_t da = qk_desc(q_base, half, ks), db = qk_desc(k_base, half, ks);
      for (int k = 0; k < 16; ++k) {
        const int dim = half * (D / 2) + 16 * ks + k;
        for (int m = 0; m < BM; ++m) expect(k_major(da, m, k) == element(q_base, m, dim), "QK A = Q[m][dim]", half, ks, m, k);
        for (int n = 0; n < BN; ++n) expect(k_major(db, n, k) == element(k_base, n, dim), "QK B = K[n][dim]", half, ks, n, k);
      }
    }
  for (int half = 0; half < 2; ++half)
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t db = pv_desc(k_base, half, kk);
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < VH; ++n)
          expect(mn_major(db, n, k) == element(k_base, 16 * kk + k, half * VH + n), "PV B = V[key][col]", half, kk, n, k);
    }
  // the 14-bit descriptor fields hold the largest addresses and strides used
  expect(start_of(make_desc(SMEM_BYTES - 16, GROUP_B, 128)) == (uint32_t)(SMEM_BYTES - 16), "start fits", SMEM_BYTES, 0, 0, 0);
  expect(lbo_of(make_desc(0, GROUP_B, 128)) == (uint32_t)GROUP_B, "lbo fits", GROUP_B, 0, 0, 0);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("wgmma layout: all checks passed\n");
  return 0;
}
