// wgmma.cuh: Hopper's warpgroup matrix multiply (wgmma.mma_async) for the flash-attention
// kernels (flash.cuh) and the experts' matmul (moe_mm.cu): the 128-byte-swizzled shared-memory
// tiles it reads, their descriptors, and the forms the kernels use.  Device code only; the
// instructions exist on sm_90a, so a build for another target compiles these to traps and the
// launchers never pick them (SL_WGMMA).
#ifndef SL_WGMMA_CUH
#define SL_WGMMA_CUH

#include "mm_load.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SL_WG_DEV 1
#else
#define SL_WG_DEV 0
#endif

// A tile of NR rows x HD bf16 columns lies as HD/64 panels of NR rows x 64 columns; a panel row is
// 128 bytes, and its 16-byte chunk c sits at chunk c ^ (row % 8) (the hardware's 128-byte
// swizzle, applied to address bits, so a tile starts on a 1024-byte boundary).  The same tile is
// read as a K-major operand (rows are the n index: keys for S = Q K^T) or an MN-major one (rows
// are the k index: keys for O += P V).  Rows [row0, row0 + NR) of g (stride elements apart),
// zeros from rend on, copied by the block's NT threads (threadIdx.x < NT): each thread's copies'
// addresses are worked out once (mm_load.cuh) and the copies unrolled.
template <int HD, int NR, int NT>
static __device__ __forceinline__ void tile_sw(bf16 *sh, const bf16 *g, size_t stride, int row0,
					       int rend)
{
	mm_ld<HD, NR, NT> L;
	const uint32_t s = smem_u32(sh);

	L.init(threadIdx.x, stride);
	const bf16 *src = g + (size_t)row0 * stride + L.g0;	// copy 0's, then RS rows on
	const size_t step = (size_t)L.RS * stride;
	const int left = rend - row0 - L.r0;			// copy i is a row while i RS < left

#pragma unroll
	for (int i = 0; i < L.NC; i++, src += step) {
		const bool ok = i * L.RS < left;

		cp_async16(s + L.soff(i), ok ? src : g, ok);
	}
}

// a tile's copies by one loader thread (mm_load.cuh): source rows [row0, row0 + NR) of g (its
// first column already added), rows at or past rend as zeros, into the tile at shared address sh
template <int HD, int NR>
static __device__ __forceinline__ void mm_load(const mm_ld<HD, NR> &L, uint32_t sh,
					       const bf16 *g, int row0, int rend)
{
	const bf16 *p = g + (size_t)row0 * L.stride;
	const int lim = rend - row0;

#pragma unroll
	for (int i = 0; i < mm_ld<HD, NR>::NC; i++) {
		const bool ok = L.row(i) < lim;

		cp_async16(sh + L.soff(i), ok ? p + L.goff(i) : g, ok);
	}
}

// mbarriers (shared memory, 8 bytes each): a phase completes when its count of arrivals has come,
// and a waiter names the phase by its parity (the first phase: 0).  Loader and multiplier threads
// hand tiles to each other through them instead of block-wide barriers.  (Traps where the build
// is not for sm_90a: the launchers never pick their kernels there.)
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count)
{
#if SL_WG_DEV
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
		     : "memory");
#elif defined(SL_EMU)
	emu_mbar_init(smem_u32(b), count);
#else
	__trap();
#endif
}

// one arrival (release: this thread's earlier shared-memory writes are seen by the waiters)
static __device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
#if SL_WG_DEV
	asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
			     smem_u32(b))
		     : "memory");
#elif defined(SL_EMU)
	emu_mbar_arrive(smem_u32(b));
#endif
}

// until the barrier's phase of this parity has completed
static __device__ __forceinline__ void mbar_wait(uint64_t *b, int parity)
{
#if SL_WG_DEV
	uint32_t done;

	do {
		asm volatile("{\n.reg .pred p;\n"
			     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
			     "selp.u32 %0, 1, 0, p;\n}\n"
			     : "=r"(done)
			     : "r"(smem_u32(b)), "r"(parity)
			     : "memory");
	} while (!done);
#elif defined(SL_EMU)
	emu_mbar_wait(smem_u32(b), parity);
#endif
}

// the barrier's arrival of this thread, once every cp.async it issued so far has landed (the
// barrier's count includes it: .noinc)
static __device__ __forceinline__ void cp_arrive(uint64_t *b)
{
#if SL_WG_DEV
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b))
		     : "memory");
#elif defined(SL_EMU)
	emu_cp_arrive(smem_u32(b));
#endif
}

// A warp-specialized kernel's register split (setmaxnreg; the kernel's __launch_bounds__ must
// give the entry count, and the warpgroups' new counts must add up to it): a loader warpgroup
// gives registers back, the multipliers take them
template <int N> static __device__ __forceinline__ void wg_regs_dec(void)
{
#if SL_WG_DEV
	asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N> static __device__ __forceinline__ void wg_regs_inc(void)
{
#if SL_WG_DEV
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// the dynamic shared memory's first 1024-byte boundary (launchers ask for 1 KB more)
static __device__ __forceinline__ bf16 *sw_base(bf16 *p)
{
	const uint32_t a = smem_u32(p);

	return p + (((a + 1023u) & ~1023u) - a) / sizeof(bf16);
}

// matrix descriptor: start address, leading and stride byte offsets (all in 16-byte units),
// 128-byte swizzle
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
	return (uint64_t)((addr & 0x3FFFFu) >> 4) | (uint64_t)(lbo >> 4) << 16 |
	       (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

// B operand, K-major, of k-step kk (16 columns) over rows [r0, r0 + n) of an NR-row tile: 8-row
// groups 1024 bytes apart, 16 columns are 32 bytes inside a panel row
template <int NR>
static __device__ __forceinline__ uint64_t desc_k(const bf16 *tile, int r0, int kk)
{
	return wg_desc(smem_u32(tile) + (kk >> 2) * NR * 128 + r0 * 128 + (kk & 3) * 32, 16, 1024);
}

// B operand, MN-major, of the 16 tile rows from r0 (the k index): panels (64 n) NR * 128 bytes
// apart, 8-row groups 1024 bytes apart
template <int NR>
static __device__ __forceinline__ uint64_t desc_mn(const bf16 *tile, int r0)
{
	return wg_desc(smem_u32(tile) + r0 * 128, NR * 128, 1024);
}

// Bulk copies from shared to global memory by the copy engine (cp.async.bulk, one thread):
// bytes (a multiple of 16) from shared address s to g, tracked by bulk groups; the source may be
// written again once a wait_group.read has seen its group read (the emulator copies at that
// wait: an early overwrite shows), the target is written once a wait_group has seen it done.
// The shared writes it reads need fence_async_smem() and a barrier before it is issued.
static __device__ __forceinline__ void bulk_store(void *g, uint32_t s, uint32_t bytes)
{
#if SL_WG_DEV
	asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(g),
		     "r"(s), "r"(bytes)
		     : "memory");
#elif defined(SL_EMU)
	emu_bulk_store(g, s, bytes);
#else
	__trap();
#endif
}

static __device__ __forceinline__ void bulk_commit(void)
{
#if SL_WG_DEV
	asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// every committed bulk group has read its source (READ) or is done
template <bool READ> static __device__ __forceinline__ void bulk_wait0(void)
{
#if SL_WG_DEV
	if constexpr (READ)
		asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
	else
		asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#elif defined(SL_EMU)
	emu_bulk_wait();
#endif
}

// cp.async wrote through the generic proxy; wgmma reads through the async one
static __device__ __forceinline__ void fence_async_smem(void)
{
#if SL_WG_DEV
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// registers written since the last wgmma (accumulators, A fragments) become visible to it
static __device__ __forceinline__ void wg_fence(void)
{
#if SL_WG_DEV
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void wg_commit(void)
{
#if SL_WG_DEV
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(SL_EMU)
	emu_wg_commit();
#endif
}

// every committed group done: the accumulators may be read
static __device__ __forceinline__ void wg_wait0(void)
{
#if SL_WG_DEV
	asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#elif defined(SL_EMU)
	emu_wg_wait(0);
#endif
}

// at most one committed group still running (groups finish in the order committed)
static __device__ __forceinline__ void wg_wait1(void)
{
#if SL_WG_DEV
	asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#elif defined(SL_EMU)
	emu_wg_wait(1);
#endif
}

// at most two committed groups still running
static __device__ __forceinline__ void wg_wait2(void)
{
#if SL_WG_DEV
	asm volatile("wgmma.wait_group.sync.aligned 2;\n" ::: "memory");
#elif defined(SL_EMU)
	emu_wg_wait(2);
#endif
}

// N registers a wgmma wrote (or reads) pinned in place: an access after this cannot move before
// it, nor one before it after (the compiler sees the registers changed here), so code after a
// wait cannot read an accumulator before the wait lets it
template <int N> static __device__ __forceinline__ void wg_pin(float *r)
{
#ifndef SL_EMU
#pragma unroll
	for (int i = 0; i < N; i++)
		asm volatile("" : "+f"(r[i])::"memory");
#endif
}

// D (m64 x nN, fp32) += A (m64 x k16, bf16, registers) * B (k16 x nN, bf16, shared memory);
// TB 0: B K-major, 1: MN-major.  A warp's part of A and of D is what mma.sync m16n8k16 gives a
// warp for its 16 rows (warp w of the group: rows 16w..16w+15), D repeated per 8 columns.
#if SL_WG_DEV
template <int TB>
static __device__ __forceinline__ void wgmma_rs32(float *d, const uint32_t *a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15}, "
		     "{%16,%17,%18,%19}, %20, p, 1, 1, %22;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
}

template <int TB>
static __device__ __forceinline__ void wgmma_rs64(float *d, const uint32_t *a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,"
		     "%24,%25,%26,%27,%28,%29,%30,%31}, "
		     "{%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
		       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
		       "+f"(d[30]), "+f"(d[31])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
}

template <int TB>
static __device__ __forceinline__ void wgmma_rs128(float *d, const uint32_t *a, uint64_t b,
						   int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,"
		     "%24,%25,%26,%27,%28,%29,%30,%31,"
		     "%32,%33,%34,%35,%36,%37,%38,%39,"
		     "%40,%41,%42,%43,%44,%45,%46,%47,"
		     "%48,%49,%50,%51,%52,%53,%54,%55,"
		     "%56,%57,%58,%59,%60,%61,%62,%63}, "
		     "{%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
		       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
		       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
		       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
		       "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
		       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
		       "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
		       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
}

// D (m64 x n32) += A (m64 x k16, shared memory) * B; TA, TB 0: K-major (the default), 1: MN-major
template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void wgmma_ss32(float *d, uint64_t a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15}, "
		     "%16, %17, p, 1, 1, %19, %20;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
		     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
}

// D (m64 x n64) += A (m64 x k16, shared memory) * B; TA, TB 0: K-major (the default), 1: MN-major
template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void wgmma_ss64(float *d, uint64_t a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,"
		     "%24,%25,%26,%27,%28,%29,%30,%31}, "
		     "%32, %33, p, 1, 1, %35, %36;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
		       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
		       "+f"(d[30]), "+f"(d[31])
		     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
}
// D (m64 x n128) += A (m64 x k16, shared memory) * B; TA, TB 0: K-major (the default), 1: MN-major
template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void wgmma_ss128(float *d, uint64_t a, uint64_t b, int acc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		     "{"
		     "%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,"
		     "%24,%25,%26,%27,%28,%29,%30,%31,"
		     "%32,%33,%34,%35,%36,%37,%38,%39,"
		     "%40,%41,%42,%43,%44,%45,%46,%47,"
		     "%48,%49,%50,%51,%52,%53,%54,%55,"
		     "%56,%57,%58,%59,%60,%61,%62,%63}, "
		     "%64, %65, p, 1, 1, %67, %68;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
		       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
		       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
		       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
		       "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
		       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
		       "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
		       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
}
#elif defined(SL_EMU)
template <int TB>
static inline void wgmma_rs32(float *d, const uint32_t *a, uint64_t b, int acc)
{
	emu_wgmma(32, d, a, 0, b, acc, 0, TB);
}
template <int TB>
static inline void wgmma_rs64(float *d, const uint32_t *a, uint64_t b, int acc)
{
	emu_wgmma(64, d, a, 0, b, acc, 0, TB);
}
template <int TB>
static inline void wgmma_rs128(float *d, const uint32_t *a, uint64_t b, int acc)
{
	emu_wgmma(128, d, a, 0, b, acc, 0, TB);
}
template <int TA = 0, int TB = 0>
static inline void wgmma_ss32(float *d, uint64_t a, uint64_t b, int acc)
{
	emu_wgmma(32, d, nullptr, a, b, acc, TA, TB);
}
template <int TA = 0, int TB = 0>
static inline void wgmma_ss64(float *d, uint64_t a, uint64_t b, int acc)
{
	emu_wgmma(64, d, nullptr, a, b, acc, TA, TB);
}
template <int TA = 0, int TB = 0>
static inline void wgmma_ss128(float *d, uint64_t a, uint64_t b, int acc)
{
	emu_wgmma(128, d, nullptr, a, b, acc, TA, TB);
}
#else
template <int TA = 0, int TB = 0>
static __device__ void wgmma_ss32(float *, uint64_t, uint64_t, int) { __trap(); }
template <int TA = 0, int TB = 0>
static __device__ void wgmma_ss64(float *, uint64_t, uint64_t, int) { __trap(); }
template <int TA = 0, int TB = 0>
static __device__ void wgmma_ss128(float *, uint64_t, uint64_t, int) { __trap(); }
template <int TB> static __device__ void wgmma_rs32(float *, const uint32_t *, uint64_t, int) { __trap(); }
template <int TB> static __device__ void wgmma_rs64(float *, const uint32_t *, uint64_t, int) { __trap(); }
template <int TB> static __device__ void wgmma_rs128(float *, const uint32_t *, uint64_t, int) { __trap(); }
#endif

// acc 0: D = A B (D's old values ignored: the first k-step of a product needs no zeroed D)
template <int N, int TB>
static __device__ __forceinline__ void wgmma_rs(float *d, const uint32_t *a, uint64_t b,
						int acc = 1)
{
	static_assert(N == 32 || N == 64 || N == 128, "wgmma_rs: n 32, 64 or 128");
	if constexpr (N == 32)
		wgmma_rs32<TB>(d, a, b, acc);
	else if constexpr (N == 64)
		wgmma_rs64<TB>(d, a, b, acc);
	else
		wgmma_rs128<TB>(d, a, b, acc);
}

// D (m64 x nN) += A (shared memory) * B, both K-major
template <int N>
static __device__ __forceinline__ void wgmma_ss(float *d, uint64_t a, uint64_t b, int acc = 1)
{
	static_assert(N == 32 || N == 64, "wgmma_ss: n 32 or 64");
	if constexpr (N == 32)
		wgmma_ss32(d, a, b, acc);
	else
		wgmma_ss64(d, a, b, acc);
}

// D (m64 x nN) += A (registers) * B, B the MN-major tile rows [r0, r0 + 16) of an NR-row tile
// (tile_sw's panels), N up to 256: past 128 as two products, columns 128.. being panels 2 and 3
// (D's second half 64 registers on)
template <int N, int NR>
static __device__ __forceinline__ void wgmma_rs_mn(float *d, const uint32_t *a, const bf16 *tile,
						   int r0)
{
	static_assert(N <= 128 || N == 256, "wgmma_rs_mn: n up to 128, or 256");
	if constexpr (N <= 128) {
		wgmma_rs<N, 1>(d, a, desc_mn<NR>(tile, r0), 1);
	} else {
		wgmma_rs<128, 1>(d, a, desc_mn<NR>(tile, r0), 1);
		wgmma_rs<128, 1>(d + 64, a, desc_mn<NR>(tile + 2 * NR * 64, r0), 1);
	}
}

// D (m64 x n256, fp32) += A (m64 x k16) * B (k16 x n256), both from shared memory; TA, TB 0:
// K-major, 1: MN-major (bf16 allows both).  acc 0: D = A B (D's old values ignored)
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_ss256(float *d, uint64_t a, uint64_t b, int acc)
{
#if SL_WG_DEV
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
		     "%0,%1,%2,%3,%4,%5,%6,%7,"
		     "%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,"
		     "%24,%25,%26,%27,%28,%29,%30,%31,"
		     "%32,%33,%34,%35,%36,%37,%38,%39,"
		     "%40,%41,%42,%43,%44,%45,%46,%47,"
		     "%48,%49,%50,%51,%52,%53,%54,%55,"
		     "%56,%57,%58,%59,%60,%61,%62,%63,"
		     "%64,%65,%66,%67,%68,%69,%70,%71,"
		     "%72,%73,%74,%75,%76,%77,%78,%79,"
		     "%80,%81,%82,%83,%84,%85,%86,%87,"
		     "%88,%89,%90,%91,%92,%93,%94,%95,"
		     "%96,%97,%98,%99,%100,%101,%102,%103,"
		     "%104,%105,%106,%107,%108,%109,%110,%111,"
		     "%112,%113,%114,%115,%116,%117,%118,%119,"
		     "%120,%121,%122,%123,%124,%125,%126,%127}, "
		     "%128, %129, p, 1, 1, %131, %132;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
		       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
		       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
		       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
		       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
		       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
		       "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
		       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
		       "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
		       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
		       "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
		       "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
		       "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
		       "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
		       "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
		       "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
		       "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
		       "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
		       "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
		       "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
		       "+f"(d[126]), "+f"(d[127])
		     : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
#elif defined(SL_EMU)
	emu_wgmma(256, d, nullptr, a, b, acc, TA, TB);
#else
	__trap();
#endif
}

#endif
