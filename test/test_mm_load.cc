/*
 * test_mm_load: cuda/mm_load.cuh (the loader of the one-launch expert matmul, cuda/moe_mm.cu, and
 * of the attention kernels' tiles, wgmma.cuh's tile_sw) on the host.  Each copy's shared offset,
 * source offset and row, worked out once per tile and stepped, against the swizzled layout's
 * formulas written out here (the per-copy arithmetic tile_sw had before it used mm_ld, which ran
 * on the GPU): of NT loaders, copy i of thread t is element e = t + NT i, row e / chunks, chunk
 * column e % chunks, panel (column / 64), 16-byte chunk (c % 8) ^ (row % 8).  Also,
 * independently of those: every 16-byte chunk of the tile is written once and every (row, chunk)
 * of the source read once, for every shape moe_mm.cu and the attention kernels load.
 */
#include <cstdint>
#include <cstdio>
#include <vector>

#include "testutil.h"
#include "../cuda/mm_load.cuh"

template <int HD, int NR, int NT = 128> static void check(size_t ld)
{
	const int CPR = HD / 8, NC = mm_ld<HD, NR, NT>::NC;
	std::vector<int> sh_hits(NR * CPR), src_hits(NR * CPR);
	int bad = 0;

	for (int t = 0; t < NT; t++) {
		mm_ld<HD, NR, NT> L;

		L.init(t, ld);
		for (int i = 0; i < NC; i++) {
			const int e = t + NT * i, r = e / CPR, c = e % CPR;
			const int ch = (c & 7) ^ (r & 7);
			const uint32_t want_s = (uint32_t)((((c >> 3) * NR + r) * 64 + ch * 8) * 2);
			const size_t want_g = (size_t)r * ld + (size_t)c * 8;

			if (L.soff(i) != want_s || L.goff(i) != want_g || L.row(i) != r) {
				if (bad++ < 5)
					fprintf(stderr, "HD %d NR %d NT %d ld %zu thread %d copy %d: "
						"shared %u (want %u), source %zu (want %zu), row %d (want "
						"%d)\n", HD, NR, NT, ld, t, i, L.soff(i), want_s, L.goff(i), want_g,
						L.row(i), r);
			}
			if (L.soff(i) % 16 == 0 && L.soff(i) / 16 < (uint32_t)(NR * CPR))
				sh_hits[L.soff(i) / 16]++;
			const size_t row = L.goff(i) / ld, col = L.goff(i) % ld;

			if (col % 8 == 0 && col / 8 < (size_t)CPR && row < (size_t)NR &&
			    (int)row == L.row(i))
				src_hits[row * CPR + col / 8]++;
		}
	}
	CHECK(bad == 0, "HD %d NR %d ld %zu: %d copies off tile_sw's places", HD, NR, ld, bad);
	int once_s = 0, once_g = 0;

	for (int k = 0; k < NR * CPR; k++) {
		once_s += sh_hits[k] == 1;
		once_g += src_hits[k] == 1;
	}
	CHECK(once_s == NR * CPR, "HD %d NR %d ld %zu: %d of %d shared chunks written once", HD,
	      NR, ld, once_s, NR * CPR);
	CHECK(once_g == NR * CPR, "HD %d NR %d ld %zu: %d of %d source chunks read once", HD, NR,
	      ld, once_g, NR * CPR);
	printf("mm_ld<%d, %d, %d> ld %zu: %d copies a thread %s\n", HD, NR, NT, ld, NC,
	       bad || once_s != NR * CPR || once_g != NR * CPR ? "FAIL" : "ok");
}

int main(void)
{
	/* moe_mm.cu's four tiles at issue 8's strides, then strides off the 64-column panels
	 * (a source row at least the tile's width) */
	const size_t lds[] = { 2048, 768, 1536, 256, 264, 520 };

	for (size_t ld : lds) {
		check<64, 128>(ld);	/* K-major A */
		check<64, 256>(ld);	/* K-major B (forward) */
		check<128, 64>(ld);	/* MN-major A (dw) */
		check<256, 64>(ld);	/* MN-major B (dx, dw) */
	}
	check<64, 128>(72);
	check<64, 256>(72);
	check<128, 128>(4096);	/* the remaining chunk count (16 a row) at two row counts */
	/* the attention kernels' tiles (wgmma.cuh's tile_sw): 128 loaders at head_dim 64 and 128
	 * over 64 rows, 256 (two warpgroups) at 256 over 32, 64 and 128 rows, at qkv strides */
	for (size_t ld : { (size_t)3072, (size_t)6144, (size_t)1536 }) {
		check<64, 64>(ld);
		check<128, 64>(ld);
		check<256, 32, 256>(ld);
		check<256, 64, 256>(ld);
		check<256, 128, 256>(ld);
	}
	return test_exit("test_mm_load");
}
