// The GPU tier's noisy neighbour: keeps every SM of GPU 0 busy with FMA loops for N seconds, from a
// process of its own, as another tenant's job would (tests/real_gpu/gpu_drills.py). Built by
// tools/real-gpu-setup.sh with nvcc; needs nothing else (the earlier run used torch, which a GPU
// host need not have).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void burn(float *out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    b = fmaf(b, c, a);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = a + b;  // stored, so the loop is not optimised away
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 15.0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    fprintf(stderr, "gpu_hog: no CUDA device\n");
    return 2;
  }
  int blocks = prop.multiProcessorCount * 8, threads = 256;
  float *out = nullptr;
  if (cudaMalloc(&out, sizeof(float) * blocks * threads) != cudaSuccess) {
    fprintf(stderr, "gpu_hog: cudaMalloc failed\n");
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  long launches = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    burn<<<blocks, threads>>>(out, 1 << 20);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      fprintf(stderr, "gpu_hog: kernel failed\n");
      return 3;
    }
    ++launches;
  }
  printf("gpu_hog: %ld launches in %.1f s on %s (%d SMs)\n", launches, seconds, prop.name, prop.multiProcessorCount);
  cudaFree(out);
  return 0;
}
