// specdiag-arch: sm_90a
// Native MLA tree-verify attention, Hopper warpgroup-MMA (wgmma) version.
//
// Same contract, launch grid, split-KV partials and LSE merge as tree_verify_mla.cu (the merge
// kernel there combines this kernel's partials); what changes is how a CTA does its math:
//   * a CTA is two warpgroups (256 threads) on 64 query rows (rows = node * H + head);
//   * shared memory holds Q and each 32-key tile in the *core-matrix* layout wgmma reads
//     without swizzling: 16-byte chunk (row r, chunk c) of a tile lives at
//       (r / 8) * 9216 + c * 128 + (r % 8) * 16 bytes,
//     so 8 rows x 16 bytes (one core matrix) are 128 contiguous bytes;
//   * S = Q K^T: warpgroup h issues wgmma.m64n32k16 over head dims [288h, 288h + 288),
//     A = Q and B = K straight from shared memory (both K-major), then the two partial S
//     are summed through shared memory (as the warp pairs of the mma.sync version do);
//   * O += P V: warpgroup h owns output columns [256h, 256h + 256): wgmma.m64n256k16 with
//     A = P from registers (the S accumulator layout is the A-fragment layout) and B = V,
//     the same shared-memory tile read MN-major (transposed): no second copy of V, no
//     ldmatrix staging, one B read per warpgroup instead of one per warp;
//   * loads: 3-stage cp.async pipeline, 16-byte chunks; the 8 lanes of a quarter-warp write
//     one core matrix (conflict-free) and read 64 contiguous bytes of each of 8 token rows.
// Needs sm_90a (-gencode=arch=compute_90a,code=sm_90a).
#include <cuda_bf16.h>
#include <stdint.h>

#include "tree_verify_common.cuh"

namespace tvw {
using tvc::pack_bf16;

constexpr int D = 576;
constexpr int DV = 512;
constexpr int BN = 32;                 // keys per tile
constexpr int BM = 64;                 // query rows per CTA
constexpr int CH = D * 2 / 16;         // 16-byte chunks per token row (72)
constexpr int GROUP_B = CH * 128;      // bytes per 8-row group of a tile (9216)
constexpr int TILE_B = BN / 8 * GROUP_B;
constexpr int Q_B = BM / 8 * GROUP_B;
constexpr int STAGES = 3;
constexpr int NT = 256;
constexpr int KH_CH = CH / 2;          // head-dim chunks per warpgroup for Q.K^T (36 = 288 dims)
constexpr int VH = DV / 2;             // output columns per warpgroup (256)
constexpr int SMEM_BYTES = Q_B + STAGES * TILE_B + 2 * BM * tvc::s_stride<BN>() * 4;  // 204800 = specdiag.attention.native.smem_bytes(4, "wgmma")
static_assert(SMEM_BYTES <= 227 * 1024, "over the sm_90 shared-memory limit per block");

// ---- layout arithmetic, host-callable so tests/cuda/wgmma_layout_check.cu can check it on a CPU ----
#define TVW_HD __host__ __device__ __forceinline__
// byte offset of 16-byte chunk `chunk` of row `row` in a core-matrix tile
TVW_HD constexpr uint32_t tile_offset(int row, int chunk) {
  return (uint32_t)((row / 8) * GROUP_B + chunk * 128 + (row % 8) * 16);
}
// the row a thread loads (always the same one), and the chunk of its k-th copy; ROWS = 32 or 64
template <int ROWS>
TVW_HD constexpr int load_row(int tid) { return ((tid >> 5) % (ROWS / 8)) * 8 + (tid & 7); }
template <int ROWS>
TVW_HD constexpr int load_copies() { return (CH / 4) * (ROWS / 8) / 8; }
template <int ROWS>
TVW_HD constexpr int load_chunk(int tid, int k) {
  return (((tid >> 5) / (ROWS / 8)) + k * (8 / (ROWS / 8))) * 4 + ((tid & 31) >> 3);
}
// Shared-memory matrix descriptor, no swizzle ("interleave" canonical layout).
// K-major operand: lbo = byte step between core matrices along K, sbo = along M/N.
// MN-major operand: sbo = byte step between core matrices along M/N, lbo = along K.
TVW_HD constexpr uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}
// Q.K^T k-step `ks` of warpgroup `half`: A (Q) and B (K tile), both K-major, start at this offset
TVW_HD constexpr uint32_t qk_offset(int half, int ks) { return tile_offset(0, half * KH_CH + 2 * ks); }
TVW_HD constexpr uint64_t qk_desc(uint32_t tile_base, int half, int ks) {
  return make_desc(tile_base + qk_offset(half, ks), 128, GROUP_B);
}
// P.V k-step `kk` (keys 16kk..16kk+15) of warpgroup `half` (columns 256 half ..): V MN-major
TVW_HD constexpr uint64_t pv_desc(uint32_t tile_base, int half, int kk) {
  return make_desc(tile_base + tile_offset(16 * kk, half * (VH / 8)), GROUP_B, 128);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// keeps the compiler from moving accumulator reads/writes across the asynchronous MMA
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }


// S[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
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

// ROWS (32 or 64) token rows into core-matrix layout at `dst`: each thread copies
// load_copies<ROWS>() chunks of its row load_row<ROWS>(tid). The 8 lanes of a quarter-warp
// write one core matrix (128 contiguous bytes) and read 64 contiguous bytes of each of 8 rows.
template <int ROWS>
__device__ __forceinline__ void load_rows(uint32_t dst, const __nv_bfloat16* src_row, int bytes) {
  const int tid = threadIdx.x, row = load_row<ROWS>(tid);
#pragma unroll
  for (int k = 0; k < load_copies<ROWS>(); ++k) {
    const int chunk = load_chunk<ROWS>(tid, k);
    cp_async16(dst + tile_offset(row, chunk), src_row + chunk * 8, bytes);
  }
}

__device__ __forceinline__ void verify_partial(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv_pool,
    const int* __restrict__ page_table, const int* __restrict__ prefix_lens,
    const __nv_bfloat16* __restrict__ tree_kv, const uint8_t* __restrict__ tree_mask,
    float* __restrict__ o_part, float* __restrict__ lse_part, int R, int T, int H, int page_size,
    int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + Q_B;
  float* sS = reinterpret_cast<float*>(smem + Q_B + STAGES * TILE_B);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int half = warp >> 2;              // warpgroup
  const int wr = (warp & 3) * 16;          // this warp's 16 rows within the CTA's 64
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = blockIdx.x * BM;
  const int split = blockIdx.y, b = blockIdx.z;

  const tvc::SplitWork w = tvc::split_work<BN>(split, b, prefix_lens, n_prefix_splits, prefix_tiles_per_split, T, tree_tiles_per_split);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};

  if (w.n_tiles > 0) {
    {
      const int r = load_row<BM>(tid);
      const int gr = row0 + r;
      load_rows<BM>(sQ, q + ((size_t)b * R + min(gr, R - 1)) * D, gr < R ? 16 : 0);
    }
    const int my_row = load_row<BN>(tid);
    auto load_tile = [&](int tile, int stage) {
      const int tok = (w.tile_begin + tile) * BN + my_row;
      const bool ok = tok < w.kv_len;
      const int tk = ok ? tok : 0;
      const __nv_bfloat16* src;
      if (!w.is_tree) {
        const int page = __ldg(page_table + (size_t)b * max_pages + tk / page_size);
        src = kv_pool + ((size_t)page * page_size + (tk % page_size)) * D;
      } else {
        src = tree_kv + ((size_t)b * T + tk) * D;
      }
      load_rows<BN>(sK + stage * TILE_B, src, ok ? 16 : 0);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < w.n_tiles) load_tile(s, s);
      cp_async_commit();
    }

    // S of one tile: the two warpgroups' partial sums exchanged through shared memory, the
    // mask, the online softmax; leaves P packed as the bf16 A fragments of P V and the factor
    // the running O must be scaled by. Contains a __syncthreads (all 256 threads call it).
    auto softmax_tile = [&](float (&s)[16], int tile, uint32_t (&a)[BN / 16][4], float (&alpha)[2]) {
      constexpr int SS = tvc::s_stride<BN>();
      tvc::store_partial_s<BN>(sS + (half * BM + wr) * SS, s, g, t4);
      __syncthreads();
      tvc::combine_and_mask<BN>(s, sS + ((half ^ 1) * BM + wr) * SS, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);
      tvc::online_softmax<BN>(s, m_r, l_r, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    // S = Q K^T over this warpgroup's 288 head dims (asynchronous: the caller commits and waits)
    auto issue_qk = [&](float (&s)[16], uint32_t kt) {
#pragma unroll
      for (int ks = 0; ks < KH_CH / 2; ++ks) wgmma_qk(s, qk_desc(sQ, half, ks), qk_desc(kt, half, ks), ks > 0);
    };
    // O += P V over this warpgroup's 256 output columns (asynchronous)
    auto issue_pv = [&](const uint32_t (&a)[BN / 16][4], uint32_t kt) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv(o, a[kk], pv_desc(kt, half, kk));
    };
    const auto stage = [&](int tile) { return sK + (tile % STAGES) * TILE_B; };

    // Software pipeline (one CTA per SM, so the overlap has to come from inside the warpgroup):
    // while the tensor cores run Q K^T of tile j + 1 and then P V of tile j, the warps exchange
    // and soft-max tile j + 1's scores. Tile t is cp.async group t; tile j + 2 is loaded into
    // the stage tile j - 1 used, once every warp has finished P V of tile j - 1.
    float s[16];
    uint32_t a[BN / 16][4], a_next[BN / 16][4];  // P of tile j (read by the running P V) and of j + 1
    float alpha[2];
    cp_async_wait<STAGES - 2>();  // Q and tile 0
    fence_proxy_async();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    wgmma_fence();
    issue_qk(s, stage(0));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    softmax_tile(s, 0, a, alpha);  // O is still zero: nothing to rescale

    for (int j = 0; j + 1 < w.n_tiles; ++j) {
      cp_async_wait<0>();  // tile j + 1
      fence_proxy_async();
      __syncthreads();     // tile j + 1 visible; every warp is past P V (j - 1) and the last exchange
      if (j + 2 < w.n_tiles) load_tile(j + 2, (j + 2) % STAGES);
      cp_async_commit();
#pragma unroll
      for (int i = 0; i < 16; ++i) fence_operand(s[i]);
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(o[i]);
      wgmma_fence();
      issue_qk(s, stage(j + 1));
      wgmma_commit();
      issue_pv(a, stage(j));
      wgmma_commit();
      wgmma_wait<1>();  // Q K^T (j + 1) done, P V (j) may still run
#pragma unroll
      for (int i = 0; i < 16; ++i) fence_operand(s[i]);
      softmax_tile(s, j + 1, a_next, alpha);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) fence_operand(o[i]);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)  // P V (j) read these registers until the wait
#pragma unroll
        for (int i = 0; i < 4; ++i) fence_operand(a[kk][i]);
      tvc::rescale_rows(o, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[kk][i] = a_next[kk][i];
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
    wgmma_fence();
    issue_pv(a, stage(w.n_tiles - 1));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  }
  cp_async_wait<0>();

  // ---- epilogue: normalised partial output and its lse (natural log) ----
  tvc::write_partial(o, m_r, l_r, o_part, lse_part, b, NS, split, R, row0 + wr, g, t4, half * VH, half == 0, DV);
}

}  // namespace tvw

#ifndef TVW_LAYOUT_ONLY
extern "C" __global__ void __launch_bounds__(tvw::NT, 1) tree_verify_partial_wgmma(
    const __nv_bfloat16* q, const __nv_bfloat16* kv_pool, const int* page_table, const int* prefix_lens,
    const __nv_bfloat16* tree_kv, const uint8_t* tree_mask, float* o_part, float* lse_part, int R, int T, int H,
    int page_size, int max_pages, int n_prefix_splits, int prefix_tiles_per_split, int tree_tiles_per_split, int NS,
    float scale_log2) {
  tvw::verify_partial(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, o_part, lse_part, R, T, H, page_size,
                      max_pages, n_prefix_splits, prefix_tiles_per_split, tree_tiles_per_split, NS, scale_log2);
}
#endif  // TVW_LAYOUT_ONLY
