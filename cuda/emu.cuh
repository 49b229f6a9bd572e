// emu.cuh: what a host build of the kernels (-DSL_EMU, a host C++ compiler) runs them on: each
// thread of a block is a fiber of test/test_fa_emu.cc's emulator, and the instructions the
// kernels reach through inline PTX (cp.async, wgmma, shuffles, barriers, reductions) are calls
// into it.  common.cuh includes this after the CUDA headers when SL_EMU is defined; nothing in
// the library is built with it.  The emulator implements the hooks with the hardware's documented
// semantics (the PTX ISA: wgmma's fragment layouts, matrix descriptors and 128-byte swizzle,
// cp.async groups), deferring asynchronous work as late as the instructions allow, so that a
// kernel reading what it has not waited for gets other numbers.
#ifndef SL_CUDA_EMU_CUH
#define SL_CUDA_EMU_CUH

#include <cstdint>
#include <type_traits>

struct emu_dim {
	unsigned x, y, z;
};

// the running fiber's thread and block indices (the emulator sets it on every switch)
struct emu_now_t {
	emu_dim tid, bid, gdim, bdim;
};
extern emu_now_t *emu_now;

#define threadIdx (emu_now->tid)
#define blockIdx (emu_now->bid)
#define gridDim (emu_now->gdim)
#define blockDim (emu_now->bdim)
#define __launch_bounds__(...)
// a block's shared variables: one object for every fiber (blocks run one after another)
#undef __shared__
#define __shared__ static
#define __syncthreads() emu_syncthreads()
#define __trap() emu_trap(__FILE__, __LINE__)

void emu_syncthreads(void);
[[noreturn]] void emu_trap(const char *file, int line);
// a warp's exchange: every lane gives v, gets lane (own ^ m)'s
uint32_t emu_shfl_xor32(uint32_t v, int m);
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m)
{
	static_assert(sizeof(T) == 4, "emu: 32-bit shuffles only");
	uint32_t u, r;
	T t;

	__builtin_memcpy(&u, &v, 4);
	r = emu_shfl_xor32(u, m);
	__builtin_memcpy(&t, &r, 4);
	return t;
}
// a warp's shift: every lane gives v, gets lane (own - d)'s, its own where that is below 0
uint32_t emu_shfl_up32(uint32_t v, int d);
static inline int __shfl_up_sync(unsigned, int v, int d)
{
	return (int)emu_shfl_up32((uint32_t)v, d);
}
// a warp's match: the lanes whose v equals this lane's
uint32_t emu_match_any32(uint32_t v);
static inline unsigned __match_any_sync(unsigned, int v)
{
	return emu_match_any32((uint32_t)v);
}
static inline int __popc(unsigned v)
{
	return __builtin_popcount(v);
}
// the fibers switch only at the emulator's calls: a plain add is atomic among them
static inline int atomicAdd(int *p, int v)
{
	const int old = *p;

	*p = old + v;
	return old;
}
// shared memory: the test's fa_sm, 1024-byte aligned; addresses are offsets into it.  fa_sm is
// also every kernel's dynamic shared memory (common.cuh's SL_DYN_SMEM)
extern __nv_bfloat16 fa_sm[];
uint32_t emu_smem_u32(const void *p);
void emu_cp_async(uint32_t dst, const void *src, int bytes, bool valid);
void emu_cp_commit(void);
void emu_cp_wait(int n);	// all but the newest n committed groups; -1: everything issued
// wgmma: D (64 x n) op= A (64 x 16) B (16 x n); a: this thread's A fragment (registers) or NULL
// (A from shared memory through adesc); ta, tb: 0 K-major, 1 MN-major
void emu_wgmma(int n, float *d, const uint32_t *a, uint64_t adesc, uint64_t bdesc, int acc,
	       int ta, int tb);
void emu_wg_commit(void);
void emu_wg_wait(int n);
void emu_red_add(float *p, float x);
// bulk copies shared -> global: pending per thread until its next bulk wait (which copies them)
void emu_bulk_store(void *g, uint32_t s, uint32_t bytes);
void emu_bulk_wait(void);
// mbarriers at shared addresses: init, arrive, wait for the phase of a parity, and the arrival
// of this thread once its cp.async copies so far have landed (.noinc)
void emu_mbar_init(uint32_t bar, int count);
void emu_mbar_arrive(uint32_t bar);
void emu_mbar_wait(uint32_t bar, int parity);
void emu_cp_arrive(uint32_t bar);
// a warp's vote and barrier
bool emu_any(bool pred);
void emu_syncwarp(void);
#define __any_sync(mask, pred) emu_any(pred)
#define __syncwarp() emu_syncwarp()
// the device's integer min and max
template <class A, class B> static inline std::common_type_t<A, B> min(A a, B b)
{
	return a < b ? a : b;
}
template <class A, class B> static inline std::common_type_t<A, B> max(A a, B b)
{
	return a < b ? b : a;
}

#endif
