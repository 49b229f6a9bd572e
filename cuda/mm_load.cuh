// mm_load.cuh: one loader thread's copies of a bf16 tile into wgmma.cuh's 128-byte swizzled
// layout (NR rows x HD columns as HD/64 panels of NR rows x 64 columns, chunk c of a panel row at
// c ^ (row % 8)), with each copy's addresses worked out once per tile instead of once per copy.
// Of NT loader threads, copy i of thread t is element e = t + NT i of the tile's 16-byte chunks
// in row order: row r0 + i RS (RS = NT / the row's chunks), the same chunk column for every i;
// so its shared offset steps by RS rows (plus a fixed shift on odd copies where RS = 4 moves the
// swizzle) and its global offset by RS rows of the source.  Plain integer code:
// test/test_mm_load.cc checks it against the layout's formulas on the host.
#ifndef SL_MM_LOAD_CUH
#define SL_MM_LOAD_CUH

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MM_HD __host__ __device__ __forceinline__
#else
#define MM_HD inline
#endif

template <int HD, int NR, int NT = 128> struct mm_ld {
	static constexpr int CPR = HD / 8;		// 16-byte chunks a row
	static constexpr int RS = NT / CPR;		// rows between a thread's copies
	static constexpr int NC = NR * CPR / NT;	// copies a thread
	static_assert(CPR == 8 || CPR == 16 || CPR == 32, "mm_ld: 64, 128 or 256 columns");
	static_assert(NT % CPR == 0 && RS % 4 == 0, "mm_ld: the loaders cover rows of 4 or 8");
	static_assert(NR % RS == 0, "mm_ld: rows a multiple of the copies' step");

	uint32_t s0;	// copy 0: bytes into the tile
	int dodd;	// bytes more for odd copies
	int r0;		// copy 0's row
	size_t g0;	// copy 0: elements from the tile's first row's first column
	size_t stride;	// elements between source rows

	// thread t of the NT loaders; ld: the source's row stride in elements
	MM_HD void init(int t, size_t ld)
	{
		const int c = t % CPR, sw = (c & 7) ^ (t / CPR & 7);

		r0 = t / CPR;
		s0 = (uint32_t)((((c >> 3) * NR + r0) * 64 + sw * 8) * 2);
		dodd = (((c & 7) ^ ((r0 + RS) & 7)) - sw) * 16;
		g0 = (size_t)r0 * ld + (size_t)c * 8;
		stride = ld;
	}
	MM_HD uint32_t soff(int i) const
	{
		return s0 + (uint32_t)(i * RS * 128 + (i & 1 ? dodd : 0));
	}
	MM_HD size_t goff(int i) const
	{
		return g0 + (size_t)i * RS * stride;
	}
	MM_HD int row(int i) const
	{
		return r0 + i * RS;
	}
};

#endif
