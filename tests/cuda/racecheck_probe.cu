// racecheck's view of named-barrier handoffs, the seesaw kernel's patterns in a few lines.
//   sync, arrive, arrive_reg: warp 1 writes shared memory, then syncs on barrier 1, or arrives on
//     it (bar.arrive, a release in the PTX memory model) by an immediate or a register id; warp 0
//     syncs on barrier 1 and reads.
//   sync_partial: sync, in a block of 3 warps whose third exits at once (the barrier counts 64 of
//     96 threads, as the seesaw's math warpgroups' barriers count 256 of 384).
//   pingpong: the seesaw's exchange of row factors: warps 0 and 1 take rounds in turn; in round r
//     the owner (r % 2) writes box[r % 2], arrives on barrier 1 + r % 2 and the other syncs on it
//     and reads, before it writes its own round's values. pingpong_sync: the owner syncs instead.
//     pingpong_then_sync: pingpong, then both warps swap a value through bar.sync 3 (the seesaw's
//     epilogue exchange of row sums after its rounds).
//   seesaw: pingpong_then_sync with the seesaw's loader: a third warp waits on barrier 4 (96
//     threads) before each of its rounds, which the two others arrive on as they finish a round,
//     then exits; the final swap goes through barrier 5 (64 threads).
//   seesaw_wg: the seesaw's hand-offs at the kernel's own sizes: 384 threads, two warpgroups of
//     four warps that hand rows over through 256-thread barriers (each thread reads a value another
//     warp wrote; the writer arrives, the reader syncs: Write-then-Read), the final swap through a
//     256-thread bar.sync; the third warpgroup exits at once.
//   seesaw_wg_loader: seesaw_wg with the third warpgroup alive through the rounds, as the seesaw
//     kernel's loader: it stores round r's tile and arrives on a LANDED barrier (ids 6, 7) that the
//     round's writer syncs on before it reads the tile; the writer arrives on a FREE barrier (ids 8,
//     9) that the loader syncs on before it stores that slot again.
//   red_or_wg: the wide kernel's per-tile vote: at the same sizes, warpgroups 0 and 1 meet each
//     round in a 256-thread bar.red.or.pred (alternating ids 1, 2), warpgroup 0 voting r % 3 == 0,
//     1 voting false; each checks the OR. (For synccheck: the wide kernel's vote is where it
//     reports divergent threads.) red_or_wg_split: the same, each warpgroup's vote its own
//     instruction, as in the wide kernel (bar.red is .aligned); red_or_wg_unaligned: the same
//     with barrier.red (not .aligned).
//   flag_wg_split: the vote as a flag in shared memory that warpgroup 0 writes before a 256-thread
//     bar.sync, each warpgroup's bar.sync its own instruction; flag_wg_arrive: warpgroup 0 arrives
//     instead (one waiting instruction per barrier, as the wide kernel does now), and syncs on a
//     second barrier that warpgroup 1 arrives on once it has read the flag (ids 3, 4) before it
//     writes that slot again.
//   seesaw_mbar: the seesaw kernel's two-tile split as it ends: the loader warpgroup copies two
//     tiles with cp.async, each completing an mbarrier (cp.async.mbarrier.arrive), and exits; math
//     warpgroup c waits for tile c, writes its row factors and arrives on barrier 3 + c behind the
//     async-proxy fence; the other syncs on it and reads them (for warpgroup 0, after its own tile:
//     the kernel's tail hand-off); then the epilogue's swap through bar.sync 5. seesaw_mbar_stay:
//     the same with the loader alive to the end (a 384-thread barrier 6). seesaw_named: the same
//     with the tiles announced on named barriers (the loader waits for its copies, then arrives on
//     7 + c), as the wide kernel does.
//   seesaw_named_nofence, seesaw_named_fence_first, seesaw_mbar_fence_first: those with the
//     async-proxy fences left out, or issued before the row factors are written instead of between
//     the write and the arrive; seesaw_bare, seesaw_bare_nofence: the row-factor hand-offs and the
//     swap alone (no tiles, no loader work), with and without the fences. bare_plain, bare_ids12,
//     bare_sync0, bare_2wg: seesaw_bare_nofence without the mbarrier set-up, by barrier ids and
//     block shape (at handoff_bare). seesaw_wg_2: seesaw_wg's loop with two rounds, the same
//     exchange as bare_plain's. bare_swapped: bare_plain with the warpgroups' roles swapped.
// Every mode prints 0 wrong outside the tools. All but red_or_wg_split and flag_wg_split are ordered
// by the PTX memory model; those two wait on one .aligned barrier from two instructions, which PTX
// leaves undefined (synccheck flags them; flag_wg_split printed wrong values under it).
// specdiag.bench.sanitize runs racecheck on each (data/sanitizer_h200.json, sanitizer_h100.json)
// to tell the tool's reach from the kernels' races, and synccheck on the warpgroup modes.
#include <cstdio>
#include <cstring>

constexpr int ROUNDS = 6;

constexpr int WG_THREADS = 128;

// seesaw_wg (see the header): warpgroups 0 and 1 take rounds in turn; seesaw_wg_2: R = 2 rounds,
// bare_plain's exchange in this loop's form
template <int R = ROUNDS>
__device__ void handoff_wg(int* out) {
  __shared__ int rows[2][WG_THREADS];
  __shared__ int sums[2][WG_THREADS];
  const int wg = threadIdx.x / WG_THREADS, i = threadIdx.x % WG_THREADS;
  const int other = (i + 32) % WG_THREADS;  // a thread of another warp
  if (wg == 2) {
    out[threadIdx.x] = 0;
    return;
  }
  int sum = 0;
  for (int r = 0; r < R; ++r) {
    if (r % 2 == wg) {
      rows[r % 2][i] = r * 1000 + i;
      if (r % 2)
        asm volatile("bar.arrive 2, 256;\n" ::: "memory");
      else
        asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    } else {
      if (r % 2)
        asm volatile("bar.sync 2, 256;\n" ::: "memory");
      else
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
      sum += rows[r % 2][other] - r * 1000 - other;
    }
  }
  sums[wg][i] = wg + 1;
  asm volatile("bar.sync 5, 256;\n" ::: "memory");
  sum += sums[wg ^ 1][other] - ((wg ^ 1) + 1);
  out[threadIdx.x] = sum;
}

// seesaw_wg_loader (see the header)
__device__ void handoff_wg_loader(int* out) {
  __shared__ int rows[2][WG_THREADS];
  __shared__ int sums[2][WG_THREADS];
  __shared__ int tile[2][WG_THREADS];
  const int wg = threadIdx.x / WG_THREADS, i = threadIdx.x % WG_THREADS;
  const int other = (i + 32) % WG_THREADS;
  if (wg == 2) {
    for (int r = 0; r < ROUNDS; ++r) {
      if (r >= 2) asm volatile("bar.sync %0, 256;\n" ::"r"(8 + r % 2) : "memory");
      tile[r % 2][i] = r * 7 + i;
      asm volatile("bar.arrive %0, 256;\n" ::"r"(6 + r % 2) : "memory");
    }
    out[threadIdx.x] = 0;
    return;
  }
  int sum = 0;
  for (int r = 0; r < ROUNDS; ++r) {
    if (r % 2 == wg) {
      asm volatile("bar.sync %0, 256;\n" ::"r"(6 + r % 2) : "memory");
      sum += tile[r % 2][other] - r * 7 - other;
      if (r + 2 < ROUNDS) asm volatile("bar.arrive %0, 256;\n" ::"r"(8 + r % 2) : "memory");
      rows[r % 2][i] = r * 1000 + i;
      asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + r % 2) : "memory");
    } else {
      asm volatile("bar.sync %0, 256;\n" ::"r"(1 + r % 2) : "memory");
      sum += rows[r % 2][other] - r * 1000 - other;
    }
  }
  sums[wg][i] = wg + 1;
  asm volatile("bar.sync 5, 256;\n" ::: "memory");
  sum += sums[wg ^ 1][other] - ((wg ^ 1) + 1);
  out[threadIdx.x] = sum;
}

// seesaw_mbar (LANDED 0, STAY false), seesaw_mbar_stay (0, true), seesaw_named (1, false); NAMED 2:
// no tiles. FENCE 0: none, 1: between the row factors' write and the arrive (as the kernel), 2: before
// the write
__device__ int4 g_tile[2][WG_THREADS];
__shared__ int4 tile[2][WG_THREADS];  // (one copy for every instance of the template)
__shared__ int alpha[2][WG_THREADS];
__shared__ int sums[2][WG_THREADS];
__shared__ unsigned long long full[2];
template <int NAMED, bool STAY, int FENCE = 1>
__device__ void handoff_mbar(int* out) {
  const int wg = threadIdx.x / WG_THREADS, i = threadIdx.x % WG_THREADS;
  const int other = (i + 32) % WG_THREADS;
  const unsigned full0 = (unsigned)__cvta_generic_to_shared(full);
  if (threadIdx.x == 0) {
    for (int t = 0; t < 2; ++t) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(full0 + 8 * t), "r"(WG_THREADS) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2 && NAMED == 2) {
    out[threadIdx.x] = 0;
    return;
  }
  if (wg == 2) {
    for (int t = 0; t < 2; ++t) {
      const unsigned dst = (unsigned)__cvta_generic_to_shared(&tile[t][i]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(&g_tile[t][i]) : "memory");
      if (!NAMED) asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full0 + 8 * t) : "memory");
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    if (NAMED) asm volatile("fence.proxy.async.shared::cta;\nbar.arrive 7, 256;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    if (NAMED) asm volatile("fence.proxy.async.shared::cta;\nbar.arrive 8, 256;\n" ::: "memory");
    if (STAY) asm volatile("bar.sync 6, 384;\n" ::: "memory");
    out[threadIdx.x] = 0;
    return;
  }
  auto landed = [&](int t) {
    if (NAMED == 2) return;
    if (NAMED) {
      if (t) asm volatile("bar.sync 8, 256;\n" ::: "memory");
      else asm volatile("bar.sync 7, 256;\n" ::: "memory");
    } else {
      asm volatile("{\n.reg .pred done;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n@!done bra WAIT_%=;\n}\n"
                   ::"r"(full0 + 8 * t) : "memory");
    }
  };
  auto fence = [] { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); };
  int bad = 0;
  if (wg == 0) {
    landed(0);
    if (FENCE == 2) fence();
    alpha[0][i] = 1000 + i;
    if (FENCE == 1) fence();
    asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    asm volatile("bar.sync 4, 256;\n" ::: "memory");  // the tail: tile 1 is the other's
    if (FENCE) fence();
    bad += alpha[1][other] != 2000 + other;
  } else {
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
    if (FENCE) fence();
    bad += alpha[0][other] != 1000 + other;
    landed(1);
    if (FENCE == 2) fence();
    alpha[1][i] = 2000 + i;
    if (FENCE == 1) fence();
    asm volatile("bar.arrive 4, 256;\n" ::: "memory");
  }
  sums[wg][i] = wg + 1;
  asm volatile("bar.sync 5, 256;\n" ::: "memory");
  bad += sums[wg ^ 1][other] != (wg ^ 1) + 1;
  if (STAY) asm volatile("bar.arrive 6, 384;\n" ::: "memory");
  out[threadIdx.x] = bad;
}

// bare_plain, bare_ids12, bare_sync0, bare_2wg: seesaw_bare_nofence's hand-offs alone, without the
// mbarrier set-up (barriers B, B + 1, then the swap on B + 2), with B = 3 or 1, with or without a
// __syncthreads first; bare_2wg launches the two math warpgroups only; bare_swapped: warpgroup 1
// hands over first (FIRST = 1), so that the second hand-off goes from warpgroup 0 to 1
template <bool SYNC0, int B, int FIRST = 0>
__device__ void handoff_bare(int* out) {
  const int wg = (threadIdx.x / WG_THREADS) ^ (threadIdx.x < 2 * WG_THREADS ? FIRST : 0);
  const int i = threadIdx.x % WG_THREADS;
  const int other = (i + 32) % WG_THREADS;
  if (SYNC0) __syncthreads();
  if (wg == 2) {
    out[threadIdx.x] = 0;
    return;
  }
  int bad = 0;
  if (wg == 0) {
    alpha[0][i] = 1000 + i;
    asm volatile("bar.arrive %0, 256;\n" ::"n"(B) : "memory");
    asm volatile("bar.sync %0, 256;\n" ::"n"(B + 1) : "memory");
    bad += alpha[1][other] != 2000 + other;
  } else {
    asm volatile("bar.sync %0, 256;\n" ::"n"(B) : "memory");
    bad += alpha[0][other] != 1000 + other;
    alpha[1][i] = 2000 + i;
    asm volatile("bar.arrive %0, 256;\n" ::"n"(B + 1) : "memory");
  }
  sums[wg][i] = wg + 1;
  asm volatile("bar.sync %0, 256;\n" ::"n"(B + 2) : "memory");
  bad += sums[wg ^ 1][other] != (wg ^ 1) + 1;
  out[threadIdx.x] = bad;
}

// red_or_wg_split, red_or_wg_unaligned: each warpgroup's vote its own instruction (warpgroup 1 tests
// its vote with setp.eq, 0 with setp.ne: texts that differ, so nvcc cannot merge the two into one)
template <bool ALIGNED>
__device__ int vote_split(int wg, int mine, int id) {
  int any;
  if (wg == 0) {
    if (ALIGNED)
      asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, 256, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                   : "=r"(any) : "r"(mine), "r"(id) : "memory");
    else
      asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbarrier.red.or.pred q, %2, 256, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                   : "=r"(any) : "r"(mine), "r"(id) : "memory");
  } else {
    if (ALIGNED)
      asm volatile("{\n.reg .pred p, q;\nsetp.eq.b32 p, %1, 1;\nbar.red.or.pred q, %2, 256, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                   : "=r"(any) : "r"(mine), "r"(id) : "memory");
    else
      asm volatile("{\n.reg .pred p, q;\nsetp.eq.b32 p, %1, 1;\nbarrier.red.or.pred q, %2, 256, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                   : "=r"(any) : "r"(mine), "r"(id) : "memory");
  }
  return any;
}

// flag_wg_split (arrive false), flag_wg_arrive (true): the vote of round r through flag[r % 2]
template <bool ARRIVE>
__device__ int vote_flag(int wg, int mine, int r) {
  __shared__ int flag[2];
  const int id = 1 + r % 2, free_id = 3 + r % 2;
  if (wg == 0) {
    if (ARRIVE && r >= 2) asm volatile("bar.sync %0, 256;\n" ::"r"(free_id) : "memory");
    if (threadIdx.x == 0) flag[r % 2] = mine;
    if (ARRIVE) {
      asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
      return mine;  // (thread 0's vote is every thread's in warpgroup 0)
    }
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
  } else {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
  }
  const int any = flag[r % 2];
  if (ARRIVE && r + 2 < ROUNDS) asm volatile("bar.arrive %0, 256;\n" ::"r"(free_id) : "memory");
  return any;
}

// red_or_wg and its split forms (see the header): split 0 one shared instruction, 1 aligned, 2 not;
// 3 and 4 the flag forms
__device__ void vote_wg(int* out, int split) {
  const int wg = threadIdx.x / WG_THREADS;
  if (wg == 2) {
    out[threadIdx.x] = 0;
    return;
  }
  int bad = 0;
#pragma unroll 1  // (the barrier id a register, as in the wide kernel)
  for (int r = 0; r < ROUNDS; ++r) {
    const int mine = wg == 0 && r % 3 == 0, id = 1 + r % 2;
    int any;
    if (split == 3)
      any = vote_flag<false>(wg, r % 3 == 0, r);
    else if (split == 4)
      any = vote_flag<true>(wg, r % 3 == 0, r);
    else if (split == 1)
      any = vote_split<true>(wg, mine, id);
    else if (split == 2)
      any = vote_split<false>(wg, mine, id);
    else
      asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, 256, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                   : "=r"(any) : "r"(mine), "r"(id) : "memory");
    bad += any != (r % 3 == 0);
  }
  out[threadIdx.x] = bad;
}

__global__ void handoff(int* out, int mode, int id) {
  if (mode == 8) {
    handoff_wg(out);
    return;
  }
  if (mode == 27) {
    handoff_wg<2>(out);
    return;
  }
  if (mode == 14) {
    handoff_wg_loader(out);
    return;
  }
  if (mode >= 15) {
    if (mode == 15) handoff_mbar<0, false>(out);
    if (mode == 16) handoff_mbar<0, true>(out);
    if (mode == 17) handoff_mbar<1, false>(out);
    if (mode == 18) handoff_mbar<1, false, 0>(out);
    if (mode == 19) handoff_mbar<1, false, 2>(out);
    if (mode == 20) handoff_mbar<0, false, 2>(out);
    if (mode == 21) handoff_mbar<2, false, 1>(out);
    if (mode == 22) handoff_mbar<2, false, 0>(out);
    if (mode == 23 || mode == 26) handoff_bare<false, 3>(out);
    if (mode == 24) handoff_bare<false, 1>(out);
    if (mode == 25) handoff_bare<true, 3>(out);
    if (mode == 28) handoff_bare<false, 3, 1>(out);
    return;
  }
  if (mode >= 9) {
    vote_wg(out, mode - 9);
    return;
  }
  __shared__ int box[2][32];
  __shared__ int last[2][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 2) {  // sync_partial's third warp exits; seesaw's is the loader
    for (int r = 0; mode == 7 && r + 1 < ROUNDS; ++r) asm volatile("bar.sync 4, 96;\n" ::: "memory");
    return;
  }
  if (mode >= 3) {
    int sum = 0;
    for (int r = 0; r < ROUNDS; ++r) {
      if (r % 2 == warp) {
        box[r % 2][lane] = r * 100 + lane;
        if (mode == 4)  // pingpong_sync
          asm volatile("bar.sync %0, 64;\n" ::"r"(1 + r % 2) : "memory");
        else if (r % 2)
          asm volatile("bar.arrive 2, 64;\n" ::: "memory");
        else
          asm volatile("bar.arrive 1, 64;\n" ::: "memory");
      } else {
        if (r % 2)
          asm volatile("bar.sync 2, 64;\n" ::: "memory");
        else
          asm volatile("bar.sync 1, 64;\n" ::: "memory");
        sum += box[r % 2][lane] - r * 100 - lane;
      }
      if (mode == 7 && r + 1 < ROUNDS) asm volatile("bar.arrive 4, 96;\n" ::: "memory");
    }
    if (mode == 6 || mode == 7) {  // the final swap
      if (lane % 4 == 0) last[warp][lane] = warp;
      if (mode == 6)
        asm volatile("bar.sync 3, 64;\n" ::: "memory");
      else
        asm volatile("bar.sync 5, 64;\n" ::: "memory");
      sum += lane % 4 ? 0 : last[warp ^ 1][lane] - (warp ^ 1);
    }
    out[warp * 32 + lane] = sum;
    return;
  }
  if (warp == 1) {
    box[0][lane] = lane + 1;
    if (mode == 1)
      asm volatile("bar.arrive 1, 64;\n" ::: "memory");
    else if (mode == 2)
      asm volatile("bar.arrive %0, 64;\n" ::"r"(id) : "memory");
    else
      asm volatile("bar.sync 1, 64;\n" ::: "memory");
    out[32 + lane] = 0;
  } else {
    asm volatile("bar.sync 1, 64;\n" ::: "memory");
    out[lane] = box[0][lane] - lane - 1;
  }
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "sync";
  const char* modes[] = {"sync",   "arrive",       "arrive_reg", "pingpong", "pingpong_sync", "sync_partial",
                         "pingpong_then_sync", "seesaw", "seesaw_wg", "red_or_wg", "red_or_wg_split", "red_or_wg_unaligned",
                         "flag_wg_split", "flag_wg_arrive", "seesaw_wg_loader", "seesaw_mbar", "seesaw_mbar_stay",
                         "seesaw_named", "seesaw_named_nofence", "seesaw_named_fence_first", "seesaw_mbar_fence_first",
                         "seesaw_bare", "seesaw_bare_nofence", "bare_plain", "bare_ids12", "bare_sync0", "bare_2wg",
                         "seesaw_wg_2", "bare_swapped"};
  int mode = -1;
  for (int i = 0; i < 29; ++i)
    if (!strcmp(name, modes[i])) mode = i;
  if (mode < 0) {
    fprintf(stderr, "unknown mode %s\n", name);
    return 2;
  }
  const int threads = mode == 26 ? 2 * WG_THREADS : mode >= 8 ? 3 * WG_THREADS : mode == 5 || mode == 7 ? 96 : 64;
  const int written = mode >= 8 ? threads : 64;  // the modes of warps write two warps' worth
  int* out;
  cudaMalloc(&out, 384 * sizeof(int));
  handoff<<<1, threads>>>(out, mode == 5 ? 0 : mode, 1);
  int host[384];
  cudaMemcpy(host, out, written * sizeof(int), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < written; ++i) bad += host[i] != 0;
  printf("%s: %d wrong\n", name, bad);
  return bad != 0;
}
