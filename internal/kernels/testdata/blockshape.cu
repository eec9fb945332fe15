// blockshape.cu: the sweep behind the block kernel's launch width
// (blocks/kernel.go, kernelGrid). It copies 4096 blocks of 16 KiB and 512
// of 2 MiB between mapped pinned host memory and device memory, laid out
// as pinmem bench blocks lays them out (host slots with 4 KiB gaps in
// shuffled order, device slots shuffled), with the copy kernel in several
// shapes: one CTA per block or one warp per block, 1-8 loads in flight per
// thread, 128-1024 threads, grids capped at 1-8 CTAs per SM, descriptors in
// mapped host or device memory. It prints GB/s and the ratio to one
// contiguous cudaMemcpyAsync of the same bytes, each way and both ways at
// once on two streams; then the driver's synchronous pageable copy at 4
// KiB-1 MiB against a pinned stage. It does not check the bytes it
// copies (pinmem bench blocks does). Not part of any build:
//
//	nvcc -O3 -std=c++17 -arch=sm_90 -o blockshape blockshape.cu
//	./blockshape              # host slots shuffled, every shape
//	./blockshape sorted       # host slots in address order
//	./blockshape shuffled quick # one shape: grid uncapped and one CTA per SM
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <chrono>
#include <cstring>
#include <cuda_runtime.h>
#define CK(x) do{cudaError_t e=(x); if(e){printf("ERR %s line %d: %s\n",#x,__LINE__,cudaGetErrorString(e)); exit(1);}}while(0)
struct Desc { unsigned long long dst, src, n; };

// One CTA (or one warp when WARP) per block; U vectors in flight per thread.
template<int U, bool WARP>
__global__ void kcopy(const Desc* __restrict__ d, unsigned count) {
  unsigned lanes = WARP ? 32 : blockDim.x;
  unsigned lane = WARP ? (threadIdx.x & 31) : threadIdx.x;
  unsigned unit = WARP ? (blockIdx.x * (blockDim.x/32) + threadIdx.x/32) : blockIdx.x;
  unsigned units = WARP ? (gridDim.x * (blockDim.x/32)) : gridDim.x;
  for (unsigned b = unit; b < count; b += units) {
    Desc e = d[b];
    const uint4* s = (const uint4*)e.src; uint4* t = (uint4*)e.dst;
    unsigned long long nv = e.n / 16;
    unsigned long long i = lane;
    for (; i + (U-1)*lanes < nv; i += U*lanes) {
      uint4 r[U];
#pragma unroll
      for (int u = 0; u < U; u++) r[u] = s[i + u*lanes];
#pragma unroll
      for (int u = 0; u < U; u++) t[i + u*lanes] = r[u];
    }
    for (; i < nv; i += lanes) t[i] = s[i];
  }
}
typedef void (*KF)(const Desc*, unsigned);

int main(int argc, char** argv) {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("SMs %d\n", sms);
  bool sorted = argc > 1 && strcmp(argv[1], "sorted") == 0;
  bool quick = argc > 2 && strcmp(argv[2], "quick") == 0;
  printf("host order %s\n", sorted ? "sorted" : "shuffled");
  size_t sizes[] = {16384, 2u<<20};
  for (size_t S : sizes) {
    int N = S == 16384 ? 4096 : 512;
    size_t gap = 4096, slot = S + gap;
    char *h, *dpool, *dpool2, *h2; CK(cudaHostAlloc(&h, slot*N, cudaHostAllocMapped)); CK(cudaHostAlloc(&h2, slot*N, cudaHostAllocMapped));
    CK(cudaMalloc(&dpool, S*N)); CK(cudaMalloc(&dpool2, S*N));
    memset(h, 1, slot*N); memset(h2, 2, slot*N);
    std::vector<int> ph(N), pd(N); for (int i=0;i<N;i++) ph[i]=pd[i]=i;
    std::mt19937 rng(1); if (!sorted) std::shuffle(ph.begin(), ph.end(), rng); std::shuffle(pd.begin(), pd.end(), rng);
    Desc *th2d, *td2h, *dh2d, *dd2h; CK(cudaHostAlloc(&th2d, N*sizeof(Desc), cudaHostAllocMapped)); CK(cudaHostAlloc(&td2h, N*sizeof(Desc), cudaHostAllocMapped));
    CK(cudaMalloc(&dh2d, N*sizeof(Desc))); CK(cudaMalloc(&dd2h, N*sizeof(Desc)));
    for (int i=0;i<N;i++) {
      th2d[i] = {(unsigned long long)(dpool + (size_t)pd[i]*S), (unsigned long long)(h + (size_t)ph[i]*slot), S};
      td2h[i] = {(unsigned long long)(h2 + (size_t)ph[i]*slot), (unsigned long long)(dpool2 + (size_t)pd[i]*S), S};
    }
    CK(cudaMemcpy(dh2d, th2d, N*sizeof(Desc), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dd2h, td2h, N*sizeof(Desc), cudaMemcpyHostToDevice));
    cudaStream_t s1, s2; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    double bytes = (double)S*N;
    // contiguous references
    char *hc, *hc2; CK(cudaHostAlloc(&hc, S*N, 0)); CK(cudaHostAlloc(&hc2, S*N, 0));
    // Host wall clock around each launch and cudaDeviceSynchronize; the median.
    auto wall = [&](auto f, int reps)->double { f(); CK(cudaDeviceSynchronize()); std::vector<double> v;
      for (int r=0;r<reps;r++){ auto t0=std::chrono::steady_clock::now(); f(); CK(cudaDeviceSynchronize()); v.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count()); }
      std::sort(v.begin(), v.end()); return v[v.size()/2]; };
    double c_h2d = wall([&]{ CK(cudaMemcpyAsync(dpool, hc, S*N, cudaMemcpyHostToDevice, s1)); }, 7);
    double c_d2h = wall([&]{ CK(cudaMemcpyAsync(hc2, dpool2, S*N, cudaMemcpyDeviceToHost, s1)); }, 7);
    double c_bi = wall([&]{ CK(cudaMemcpyAsync(dpool, hc, S*N, cudaMemcpyHostToDevice, s1)); CK(cudaMemcpyAsync(hc2, dpool2, S*N, cudaMemcpyDeviceToHost, s2)); }, 7);
    printf("S=%zu N=%d contiguous h2d %.1f d2h %.1f bidir %.1f GB/s\n", S, N, bytes/c_h2d/1e9, bytes/c_d2h/1e9, 2*bytes/c_bi/1e9);
    struct V { const char* name; KF f; int thr; bool warp; };
    V vs[] = { {"cta-u1-256", kcopy<1,false>, 256, false}, {"cta-u2-256", kcopy<2,false>, 256, false}, {"cta-u4-256", kcopy<4,false>, 256, false},
               {"cta-u1-512", kcopy<1,false>, 512, false}, {"cta-u1-1024", kcopy<1,false>, 1024, false}, {"cta-u4-128", kcopy<4,false>, 128, false},
               {"cta-u2-1024", kcopy<2,false>, 1024, false},
               {"warp-u1-256", kcopy<1,true>, 256, true}, {"warp-u4-256", kcopy<4,true>, 256, true}, {"warp-u8-256", kcopy<8,true>, 256, true} };
    int caps[] = {0, 1, 2, 4, 8};
    for (auto& v : vs) for (int cap : caps) for (int dev = 0; dev < 2; dev++) {
      if (quick && (&v != &vs[0] || dev || (cap != 0 && cap != 1))) continue;
      int units = v.warp ? N : N; int per = v.warp ? v.thr/32 : 1;
      int grid = (units + per - 1)/per; if (cap) grid = std::min(grid, cap*sms);
      const Desc* t1 = dev ? dh2d : th2d; const Desc* t2 = dev ? dd2h : td2h;
      double th = wall([&]{ v.f<<<grid, v.thr, 0, s1>>>(t1, N); }, 5);
      double td = wall([&]{ v.f<<<grid, v.thr, 0, s1>>>(t2, N); }, 5);
      double tb = wall([&]{ v.f<<<grid, v.thr, 0, s1>>>(t1, N); v.f<<<grid, v.thr, 0, s2>>>(t2, N); }, 5);
      CK(cudaGetLastError());
      printf("S=%zu %-12s cap=%d desc=%s grid=%5d  h2d %5.1f (%.2f)  d2h %5.1f (%.2f)  bidir %5.1f (%.2f)\n", S, v.name, cap, dev?"dev ":"host", grid,
        bytes/th/1e9, c_h2d/th, bytes/td/1e9, c_d2h/td, 2*bytes/tb/1e9, c_bi/tb);
      fflush(stdout);
    }
    CK(cudaFreeHost(h)); CK(cudaFreeHost(h2)); CK(cudaFree(dpool)); CK(cudaFree(dpool2)); CK(cudaFreeHost(hc)); CK(cudaFreeHost(hc2));
    CK(cudaFreeHost(th2d)); CK(cudaFreeHost(td2h)); CK(cudaFree(dh2d)); CK(cudaFree(dd2h));
  }
  if (quick) return 0;
  // Does the driver's synchronous pageable copy return before the DMA ran?
  {
    size_t ns[] = {4096, 65536, 1u<<20};
    char* dbuf; CK(cudaMalloc(&dbuf, 1u<<20)); char* pg = (char*)malloc(1u<<20); memset(pg, 3, 1u<<20);
    char* stg; CK(cudaHostAlloc(&stg, 1u<<20, 0)); char* pgo = (char*)malloc(1u<<20);
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto med = [&](auto f){ std::vector<double> v; for(int r=0;r<3000;r++){ auto t0=std::chrono::steady_clock::now(); f(); v.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count()*1e6);} std::sort(v.begin(),v.end()); return v[v.size()/2]; };
    for (size_t n : ns) {
      double a = med([&]{ CK(cudaMemcpy(dbuf, pg, n, cudaMemcpyHostToDevice)); });
      double b = med([&]{ CK(cudaMemcpy(dbuf, pg, n, cudaMemcpyHostToDevice)); CK(cudaDeviceSynchronize()); });
      double c = med([&]{ memcpy(stg, pg, n); CK(cudaMemcpyAsync(dbuf, stg, n, cudaMemcpyHostToDevice, s)); CK(cudaStreamSynchronize(s)); });
      double d = med([&]{ CK(cudaMemcpy(pgo, dbuf, n, cudaMemcpyDeviceToHost)); });
      double e = med([&]{ CK(cudaMemcpyAsync(stg, dbuf, n, cudaMemcpyDeviceToHost, s)); CK(cudaStreamSynchronize(s)); memcpy(pgo, stg, n); });
      printf("small n=%zu us: h2d driver-sync %.2f, +ctxsync %.2f, stage+async+streamsync %.2f | d2h driver-sync %.2f, stage %.2f\n", n, a, b, c, d, e);
    }
  }
  return 0;
}
