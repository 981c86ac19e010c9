// Does cp.async with an L2 evict-last policy (FlashMLA's sparse prefill loader) run on this GPU?
// Each thread copies 16 bytes into shared memory, half of them zero-filled (src-size 0), and the
// block writes them back. Modes: plain (cp.async .L2::256B), policy (.L2::cache_hint with
// createpolicy.fractional.L2::evict_last), unsplit (policy, the shared address kept in one register;
// split into register + uniform register, as ptxas 12.4-13.0 do, the base appears in the SASS to
// take the uniform register the policy's descriptor was built in, and the copy faults).
// Prints "<mode>: <n> wrong" and exits 1 if any. Runs: data/history/evict_last_probe_h200.json
// (plain, policy), data/history/session31_h100.json run1_probe (all three).
#include <cstdio>
#include <cstring>
#include <stdint.h>

__global__ void copy(const int4* src, int4* out, int mode) {
  __shared__ int4 buf[256];
  const int t = threadIdx.x;
  const uint32_t dst = (uint32_t)__cvta_generic_to_shared(&buf[t]);
  const int bytes = t % 2 ? 0 : 16;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  if (mode == 0) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src + t), "r"(bytes));
  } else if (mode == 1) {  // (each mode its own asm text: identical statements would be merged)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3; // split\n" ::"r"(dst),
                 "l"(src + t), "r"(bytes), "l"(policy));
  } else {
    const uint32_t one = dst ^ ((uint32_t)t >> 16);  // ^ 0, not provably: no uniform part to split off
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3; // unsplit\n" ::"r"(one),
                 "l"(src + t), "r"(bytes), "l"(policy));
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  out[t] = buf[t];
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "plain";
  const int mode = strcmp(name, "policy") == 0 ? 1 : strcmp(name, "unsplit") == 0 ? 2 : 0;
  int4 host[256], back[256];
  for (int i = 0; i < 256; ++i) host[i] = make_int4(i, i + 1, i + 2, i + 3);
  int4 *src, *out;
  cudaMalloc(&src, sizeof(host));
  cudaMalloc(&out, sizeof(host));
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  copy<<<1, 256>>>(src, out, mode);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    printf("%s: %s\n", name, cudaGetErrorString(err));
    return 1;
  }
  cudaMemcpy(back, out, sizeof(back), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 256; ++i) {
    const int4 want = i % 2 ? make_int4(0, 0, 0, 0) : host[i];
    bad += back[i].x != want.x || back[i].y != want.y || back[i].z != want.z || back[i].w != want.w;
  }
  printf("%s: %d wrong\n", name, bad);
  return bad != 0;
}
