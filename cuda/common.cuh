// common.cuh: what the .cu files of cuda/ share: the context, error checks, bf16 helpers.
// Internal to cuda/; C code sees only sl_cuda.h.
#ifndef SL_CUDA_COMMON_CUH
#define SL_CUDA_COMMON_CUH

#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#include "sl_cuda.h"
#ifdef SL_EMU
#include "emu.cuh"
#endif

typedef __nv_bfloat16 bf16;

// a kernel's dynamic shared memory as an array `name` of T, 16-byte aligned (on the host
// emulation: emu.cuh's fa_sm)
#ifdef SL_EMU
#define SL_DYN_SMEM(T, name) T *name = (T *)::fa_sm
#else
#define SL_DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

// a device function kept out of line (nvcc's __noinline__; the host emulation's compiler knows
// only the attribute)
#ifdef SL_EMU
#define SL_NOINLINE __attribute__((noinline))
#else
#define SL_NOINLINE __noinline__
#endif

// Leaf code knows no rank: host and file:line are what a failing call can name.
static inline void sl_cuda_die(const char *what, const char *msg, const char *file, int line)
{
	char host[256] = "?";

	gethostname(host, sizeof(host) - 1);
	fprintf(stderr, "cuda error on %s at %s:%d: %s: %s\n", host, file, line, what, msg);
	abort();
}

#define CUDA_CHECK(stmt)                                                                  \
	do {                                                                              \
		cudaError_t _e = (stmt);                                                  \
		if (_e != cudaSuccess)                                                    \
			sl_cuda_die(#stmt, cudaGetErrorString(_e), __FILE__, __LINE__);   \
	} while (0)

#define CUBLAS_CHECK(stmt)                                                                \
	do {                                                                              \
		cublasStatus_t _s = (stmt);                                               \
		if (_s != CUBLAS_STATUS_SUCCESS)                                          \
			sl_cuda_die(#stmt, cublasGetStatusString(_s), __FILE__, __LINE__); \
	} while (0)

// after a kernel launch: launch-configuration errors surface here, not at a later call
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

struct gemm_entry;

struct sl_cuda {
	int device;
	cudaStream_t stream;
	cublasLtHandle_t lt;
	void *ws;			// cuBLASLt workspace
	size_t ws_bytes;
	void *scratch;			// partial sums of the deterministic reductions
	size_t scratch_bytes;
	struct gemm_entry *gemms;	// cached matmul descriptors and algorithms, per shape
	struct moe_gemm *moe;		// the grouped matmuls' cuBLAS handle (moe.cu), or NULL
	int n_gemms, cap_gemms;
	cudaEvent_t ev0, ev1;		// sl_cuda_timer_*, made on first use
	// small uploads (micro-batch ids, lengths, labels) go through pinned staging slots and do
	// not wait for the stream; each slot's event says when its copy has left the host
	char *stage;			// STAGE_SLOTS x STAGE_BYTES pinned host memory, or NULL
	cudaEvent_t stage_ev[8];
	unsigned stage_next;
	// asynchronous host transfers (copy.cu): one stream per direction, so uploads and
	// downloads use both copy engines; order_ev orders a copy after the compute stream
	cudaStream_t up, down;
	cudaEvent_t order_ev;
	pthread_mutex_t copy_mu;	// copies are issued from two threads (shard's offload worker)
	bool range_open;		// an NVTX range "step N" is open (sl_cuda_step_range)
	bool deterministic;		// train.deterministic: no kernel whose sums' order varies
	// stream priorities: the compute stream (and the experts' streams) the greatest, the side
	// stream (sl_cuda_side_begin: AdamW under the next forward) the least
	int prio, prio_side;
	cudaStream_t side;		// made on the first sl_cuda_side_begin, or NULL
	cudaStream_t main;		// the compute stream while ops go to the side one, else NULL
	cudaEvent_t side_fork;		// orders the side stream after the compute stream
	void *side_scratch;		// SIDE_SCRATCH_BYTES (made with the context, counted in its
					// fixed bytes): the side stream's sumsq partials
};

#define SIDE_SCRATCH_BYTES (64u << 10)

void sl_cuda_copy_init(struct sl_cuda *c);
void sl_cuda_copy_fini(struct sl_cuda *c);

static __device__ __forceinline__ float bf(bf16 v)
{
	return __bfloat162float(v);
}

static __device__ __forceinline__ bf16 tobf(float v)
{
	return __float2bfloat16_rn(v);
}

// 8 bf16 (one 16-byte word) as floats; ld8 / st8: at a 16-byte aligned address, as floats, and
// back (each rounded as tobf rounds)
static __device__ __forceinline__ void cvt8(float *f, uint4 v)
{
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;

#pragma unroll
	for (int k = 0; k < 4; k++) {
		float2 t = __bfloat1622float2(h[k]);

		f[2 * k] = t.x;
		f[2 * k + 1] = t.y;
	}
}

static __device__ __forceinline__ void ld8(float *f, const bf16 *p)
{
	cvt8(f, *(const uint4 *)p);
}

static __device__ __forceinline__ void st8(bf16 *p, const float *f)
{
	uint4 v;
	__nv_bfloat162 *h = (__nv_bfloat162 *)&v;

#pragma unroll
	for (int k = 0; k < 4; k++)
		h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
	*(uint4 *)p = v;
}

// 4 bf16 (8 bytes) as floats, and back (to nearest even)
static __device__ __forceinline__ void cvt4(float *f, uint2 v)
{
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
	float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);

	f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

static __device__ __forceinline__ uint2 pack4(const float *f)
{
	uint2 v;
	__nv_bfloat162 *h = (__nv_bfloat162 *)&v;

	h[0] = __floats2bfloat162_rn(f[0], f[1]);
	h[1] = __floats2bfloat162_rn(f[2], f[3]);
	return v;
}

static __device__ __forceinline__ float sigm(float x)
{
	return 1.f / (1.f + expf(-x));
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// the sum over each four lanes 4i .. 4i + 3, (v0 + v1) + (v2 + v3) in every one of them (the
// whole warp calls it)
static __device__ __forceinline__ float quad_sum(float v)
{
	v += __shfl_xor_sync(0xffffffffu, v, 1);
	return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// sum over the block (blockDim a multiple of 32, <= 1024); every thread gets the result
static __device__ __forceinline__ float block_sum(float v)
{
	__shared__ float sh[32];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;

	v = warp_sum(v);
	__syncthreads();	// sh may still be read by a previous call
	if (!lane)
		sh[warp] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.f;
	return warp_sum(v);
}

// cp.async: global -> shared copies that do not pass through registers, so that a tile's
// copies are all in flight at once; the copier waits (cp_wait_all, or a group wait) before the
// barrier that publishes them.  !valid writes zeros (rows past a record) and reads nothing.
static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
#ifdef SL_EMU
	return emu_smem_u32(p);
#else
	return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// 16 bytes (src and dst aligned to 16)
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
#ifdef SL_EMU
	emu_cp_async(dst, src, 16, valid);
#else
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
		     "r"(valid ? 16 : 0));
#endif
}

// 4 bytes (aligned to 4)
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid)
{
#ifdef SL_EMU
	emu_cp_async(dst, src, 4, valid);
#else
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
		     "r"(valid ? 4 : 0));
#endif
}

static __device__ __forceinline__ void cp_commit(void)
{
#ifdef SL_EMU
	emu_cp_commit();
#else
	asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// every copy this thread issued complete
static __device__ __forceinline__ void cp_wait_all(void)
{
#ifdef SL_EMU
	emu_cp_wait(-1);
#else
	asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// all but the newest group complete (the newest is the tile being prefetched)
static __device__ __forceinline__ void cp_wait1(void)
{
#ifdef SL_EMU
	emu_cp_wait(1);
#else
	asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}

// all but the two newest groups complete (a three-stage pipeline)
static __device__ __forceinline__ void cp_wait2(void)
{
#ifdef SL_EMU
	emu_cp_wait(2);
#else
	asm volatile("cp.async.wait_group 2;\n" ::: "memory");
#endif
}

// four 8 x 8 bf16 matrices from shared memory (lanes 8q .. 8q + 7 give matrix q's row
// addresses); .trans: each transposed
static __device__ __forceinline__ void ldsm4(uint32_t *r, uint32_t addr)
{
#ifdef SL_EMU
	__trap();	// (the mma.sync kernels are not emulated)
#else
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr));
#endif
}

static __device__ __forceinline__ void ldsm4t(uint32_t *r, uint32_t addr)
{
#ifdef SL_EMU
	__trap();
#else
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr));
#endif
}

// Packed rows (attention): pos (B*L) holds each token's position in its document, so row i's
// document starts at i - pos[i] and its keys are [i - pos[i], i].  Without pos the row is one
// document.  Document starts never decrease along a row, so a block's first row has the earliest.
static __device__ __forceinline__ int doc_start(const int *pos, int b, int L, int i)
{
	return pos ? i - pos[(size_t)b * L + i] : 0;
}

// blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed
static inline unsigned grid_for(size_t n, int threads)
{
	size_t b = (n + threads - 1) / threads;

	if (b > 8192)
		b = 8192;
	return b ? (unsigned)b : 1;
}

// scratch as floats, checked against its size (sized at create; grown once, by the chunked delta
// rule's first backward, to hold its dS and dq, dk: sl_cuda_scratch_grow)
float *sl_cuda_scratch(struct sl_cuda *c, size_t bytes, const char *who);
int sl_cuda_scratch_grow(struct sl_cuda *c, size_t bytes);	// 0, or -1: no room (kept)

// the current device is compute capability 9.0, the target of the sm_90a (SL_WGMMA) kernels
// (context.cu; asked once)
bool sl_cuda_sm90(void);
// the experts with rows, largest first (stable), into order; returns how many (moe.cu)
int sl_cuda_moe_order(int *order, const int *h_offs, int E);

// dbias(N) += column sums of dout(T, N) (ops.cu), for the matmul backward (gemm.cu)
extern "C" void sl_cuda_bias_grad(struct sl_cuda *c, void *dbias, const void *dout, int T, int N);
// the matmul cache's descriptors (gemm.cu), released by sl_cuda_destroy (context.cu)
void sl_cuda_gemm_cache_free(struct sl_cuda *c);
// the grouped matmuls' handle and buffers (moe.cu), released by sl_cuda_destroy
void sl_cuda_moe_free(struct sl_cuda *c);

#endif
