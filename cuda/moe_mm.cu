// moe_mm.cu: the experts' grouped matmuls in one kernel on Hopper's warpgroup MMA (sm_90a,
// SL_WGMMA): every expert's output tiles in one launch, the heaviest experts' first, so the small
// experts' tiles fill the GPU together instead of one under-filled cuBLAS call each.  Opt-in
// (SHARDLM_MOE_GEMM=wg; wg-bwd: the backward's forms only, wg-dw: dw only, narrow: the backward
// where the experts' inputs are at most 1024 wide): its first versions ran at half the
// per-expert cuBLASLt calls' speed (bench/RESULTS.md, twenty-first session), the loader being
// the limit; since the loader works out its addresses once a tile (twenty-third session) it
// runs the down projection's backward faster than they do (twenty-sixth session).
//
// A block computes one 128 x 256 output tile: warpgroup 0 loads 64-deep slices of the two
// operands with cp.async into a ring of MM_ST stages (128-byte swizzled tiles, wgmma.cuh's
// layout, each thread's copy addresses worked out once a tile: mm_load.cuh; rows past an
// expert's last one are zeros), each stage's mbarrier completing when its copies have landed;
// warpgroups 1 and 2 each multiply 64 of the tile's rows by its 256 columns (m64n256k16, both
// operands from shared memory, fp32 accumulators) and hand each stage back once its products
// are done.  Three forms, per expert e with rows [o, o + R) of the permuted
// tokens:
//   0 (forward):  out[o + r, n] = sum_k x[o + r, k] w_e[n, k]          A K-major, B K-major
//   1 (dx):       dx[o + r, k]  = sum_n dy[o + r, n] w_e[n, k]         A K-major, B MN-major
//   2 (dw):       dw_e[n, k]   += sum_r dy[o + r, n] x[o + r, k]       A MN-major, B MN-major
//   3 (dw, set):  dw_e[n, k]    = the same sum (dw_e's old values not read)
// Each output element is one block's fixed-order sum: the results do not depend on the launch.
#include "common.cuh"
#include "wgmma.cuh"
#include "mm_load.cuh"

#define MM_BM 128
#define MM_BN 256
#define MM_BK 64
#define MM_ST 4		// stages in the ring
#define MM_MAXG 128	// experts a launch can take
#define MM_SMEM (MM_ST * (MM_BM + MM_BN) * MM_BK * 2 + 1024 + 2 * MM_ST * 8)

// the experts with rows, heaviest first: expert, first row, rows, first tile (t0[n]: all tiles)
struct mm_groups {
	int n;
	int e[MM_MAXG], o[MM_MAXG], r[MM_MAXG];
	int t0[MM_MAXG + 1];
};

// K, N: the expert matmul's (out = x w_e^T: x rows x K, w_e N x K); ws: elements between experts'
// weights (forms 0, 1) or dw blocks (form 2)
template <int FORM>
__global__ void __launch_bounds__(384, 1)
k_moe_mm(bf16 *out, const bf16 *a, const bf16 *b, const __grid_constant__ mm_groups g, int K,
	 int N, size_t ws)
{
	extern __shared__ unsigned char mm_smem[];
	bf16 *const sA = sw_base((bf16 *)mm_smem);
	bf16 *const sB = sA + MM_ST * MM_BM * MM_BK;
	uint64_t *const full = (uint64_t *)(sB + MM_ST * MM_BN * MM_BK), *const empty = full + MM_ST;
	const int t = blockIdx.x;
	int gi = 0;

	while (gi + 1 < g.n && g.t0[gi + 1] <= t)
		gi++;
	const int e = g.e[gi], o = g.o[gi], R = g.r[gi], lt = t - g.t0[gi];
	const int ntn = (FORM == 0 ? N : K) / MM_BN, mt = lt / ntn, nt = lt % ntn;
	const int KT = FORM == 0 ? K / MM_BK : FORM == 1 ? N / MM_BK : (R + MM_BK - 1) / MM_BK;

	if (threadIdx.x == 0)
		for (int s = 0; s < MM_ST; s++) {
			mbar_init(&full[s], 128);
			mbar_init(&empty[s], 256);
		}
	__syncthreads();
	if (threadIdx.x < 128) {	// the loader
		// K-major tiles (forms 0, 1: A, and B of form 0), MN-major ones (B of 1, A and B of 2)
		mm_ld<64, MM_BM> lka;
		mm_ld<64, MM_BN> lkb;
		mm_ld<MM_BM, MM_BK> lma;
		mm_ld<MM_BN, MM_BK> lmb;

		if (FORM == 0) {
			lka.init(threadIdx.x, K);
			lkb.init(threadIdx.x, K);
		} else if (FORM == 1) {
			lka.init(threadIdx.x, N);
			lmb.init(threadIdx.x, K);
		} else {
			lma.init(threadIdx.x, N);
			lmb.init(threadIdx.x, K);
		}
		for (int kt = 0; kt < KT; kt++) {
			const int s = kt % MM_ST;
			const uint32_t A = smem_u32(sA + s * MM_BM * MM_BK);
			const uint32_t B = smem_u32(sB + s * MM_BN * MM_BK);

			if (kt >= MM_ST)
				mbar_wait(&empty[s], (kt / MM_ST - 1) & 1);
			if (FORM == 0) {
				mm_load(lka, A, a + (size_t)o * K + kt * MM_BK, mt * MM_BM, R);
				mm_load(lkb, B, b + e * ws + kt * MM_BK, nt * MM_BN, N);
			} else if (FORM == 1) {
				mm_load(lka, A, a + (size_t)o * N + kt * MM_BK, mt * MM_BM, R);
				mm_load(lmb, B, b + e * ws + nt * MM_BN, kt * MM_BK, N);
			} else {
				mm_load(lma, A, a + (size_t)o * N + mt * MM_BM, kt * MM_BK, R);
				mm_load(lmb, B, b + (size_t)o * K + nt * MM_BN, kt * MM_BK, R);
			}
			cp_arrive(&full[s]);
		}
		cp_wait_all();
		return;
	}
	// the two multipliers: rows [64 c, 64 c + 64) of the tile
	const int c = threadIdx.x / 128 - 1, w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
	float d[128];

	for (int kt = 0; kt < KT; kt++) {
		const int s = kt % MM_ST;
		const bf16 *A = sA + s * MM_BM * MM_BK, *B = sB + s * MM_BN * MM_BK;

		mbar_wait(&full[s], (kt / MM_ST) & 1);
		fence_async_smem();	// the loader's cp.async writes, seen here, reach the MMAs
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < MM_BK / 16; kk++) {
			const uint64_t da = FORM >= 2 ? desc_mn<MM_BK>(A + c * 64 * MM_BK, 16 * kk) :
							desc_k<MM_BM>(A, 64 * c, kk);
			const uint64_t db = FORM == 0 ? desc_k<MM_BN>(B, 0, kk) :
							desc_mn<MM_BK>(B, 16 * kk);

			wgmma_ss256<FORM >= 2, FORM != 0>(d, da, db, kt | kk);
		}
		wg_commit();
		wg_wait1();	// the stage before this one is read: back to the loader
		if (kt > 0)
			mbar_arrive(&empty[(kt - 1) % MM_ST]);
	}
	wg_wait0();
	wg_pin<128>(d);
	// d[4j + 0, 1]: row r0, columns 8j + 2 (lane % 4) + 0, 1; d[4j + 2, 3]: row r0 + 8
	const int r0 = mt * MM_BM + 64 * c + 16 * w + lane / 4, c0 = nt * MM_BN + 2 * (lane % 4);

	if (FORM >= 2) {
		bf16 *C = out + e * ws;

#pragma unroll
		for (int h = 0; h < 2; h++) {
			__nv_bfloat162 *p = (__nv_bfloat162 *)(C + (size_t)(r0 + 8 * h) * K + c0);

#pragma unroll
			for (int j = 0; j < 32; j++) {
				const float2 old = FORM == 2 ? __bfloat1622float2(p[4 * j]) :
							       make_float2(0.f, 0.f);

				p[4 * j] = __floats2bfloat162_rn(__fadd_rn(d[4 * j + 2 * h], old.x),
								 __fadd_rn(d[4 * j + 2 * h + 1],
									   old.y));
			}
		}
		return;
	}
	const int ld = FORM == 0 ? N : K;

#pragma unroll
	for (int h = 0; h < 2; h++) {
		if (r0 + 8 * h >= R)
			continue;
		__nv_bfloat162 *p = (__nv_bfloat162 *)(out + (size_t)(o + r0 + 8 * h) * ld + c0);

#pragma unroll
		for (int j = 0; j < 32; j++)
			p[4 * j] = __floats2bfloat162_rn(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
	}
}

// on for this form of a matmul whose experts take K wide rows: a build with SL_WGMMA, a device of
// compute capability 9.0, SHARDLM_MOE_GEMM=wg (every form), wg-bwd (forms 1 and 2), wg-dw
// (form 2) or narrow (forms 1 and 2 where K is at most 1024: the products whose outputs have
// few tiles an expert, where the per-expert cuBLASLt calls fill the GPU worst) (read once)
static bool mm_on(int form, int K)
{
#ifdef SL_WGMMA
	static int forms = -1;	// bit f: form f; bit 3: narrow

	if (forms < 0) {
		const char *v = getenv("SHARDLM_MOE_GEMM");

		forms = !v || !sl_cuda_sm90() ? 0 : !strcmp(v, "wg") ? 7 : !strcmp(v, "wg-bwd") ? 6 :
			!strcmp(v, "wg-dw") ? 4 : !strcmp(v, "narrow") ? 8 | 6 : 0;
	}
	return (forms >> form & 1) && (!(forms & 8) || K <= 1024);
#else
	(void)form;
	(void)K;
	return false;
#endif
}

template <int FORM>
static void mm_launch(cudaStream_t st, const mm_groups &g, bf16 *out, const bf16 *a,
		      const bf16 *b, int K, int N, size_t ws)
{
	static bool done;

	if (!done) {
		CUDA_CHECK(cudaFuncSetAttribute(k_moe_mm<FORM>,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						MM_SMEM));
		done = true;
	}
	k_moe_mm<FORM><<<g.t0[g.n], 384, MM_SMEM, st>>>(out, a, b, g, K, N, ws);
	CUDA_LAUNCHED();
}

// whether the kernel takes form @form of these operands: a build with SL_WGMMA on a device of
// compute capability 9.0, at most MM_MAXG experts, dimensions multiples of the tiles, operands
// 16-byte aligned
extern "C" bool sl_cuda_moe_mm_fits(int form, const void *out, const void *a, const void *b,
				    int E, int K, int N, size_t ws)
{
#ifdef SL_WGMMA
	const int mdim = form >= 2 ? N : 0, ndim = form == 0 ? N : K, kdim = form == 1 ? N : K;

	return sl_cuda_sm90() && E <= MM_MAXG && !(ndim % MM_BN) && !(mdim % MM_BM) &&
	       !(kdim % MM_BK) && !((uintptr_t)out % 16) && !((uintptr_t)a % 16) &&
	       !((uintptr_t)b % 16) && !(ws % 8);
#else
	(void)form, (void)out, (void)a, (void)b, (void)E, (void)K, (void)N, (void)ws;
	return false;
#endif
}

// form 0, 1, 2 or 3 (above) on stream @st for the experts of [0, E) with rows h_offs[e] ..
// h_offs[e + 1] whose row count is under @max_rows (0: all), if any; the caller checked
// sl_cuda_moe_mm_fits
extern "C" void sl_cuda_moe_mm_rows(cudaStream_t st, int form, void *out, const void *a,
				    const void *b, const int *h_offs, int E, int K, int N, size_t ws,
				    int max_rows)
{
	const int ndim = form == 0 ? N : K;
	int order[MM_MAXG];
	const int ne = sl_cuda_moe_order(order, h_offs, E);
	mm_groups g;

	g.n = 0;
	g.t0[0] = 0;
	for (int i = 0; i < ne; i++) {
		const int e = order[i], r = h_offs[e + 1] - h_offs[e];

		if (max_rows && r >= max_rows)
			continue;
		const int mt = form >= 2 ? N / MM_BM : (r + MM_BM - 1) / MM_BM;

		g.e[g.n] = e;
		g.o[g.n] = h_offs[e];
		g.r[g.n] = r;
		g.t0[g.n + 1] = g.t0[g.n] + mt * (ndim / MM_BN);
		g.n++;
	}
	if (!g.n)
		return;
#ifdef SL_WGMMA
	if (form == 0)
		mm_launch<0>(st, g, (bf16 *)out, (const bf16 *)a, (const bf16 *)b, K, N, ws);
	else if (form == 1)
		mm_launch<1>(st, g, (bf16 *)out, (const bf16 *)a, (const bf16 *)b, K, N, ws);
	else if (form == 2)
		mm_launch<2>(st, g, (bf16 *)out, (const bf16 *)a, (const bf16 *)b, K, N, ws);
	else
		mm_launch<3>(st, g, (bf16 *)out, (const bf16 *)a, (const bf16 *)b, K, N, ws);
#endif
}

// form 0, 1, 2 or 3 (above) for experts [0, E) with rows h_offs[e] .. h_offs[e + 1]; false
// (nothing launched) where the kernel is not chosen (mm_on; form 3 as 2) or does not apply
// (sl_cuda_moe_mm_fits)
extern "C" bool sl_cuda_moe_mm(struct sl_cuda *c, int form, void *out, const void *a,
			       const void *b, const int *h_offs, int E, int K, int N, size_t ws)
{
	if (!mm_on(form < 3 ? form : 2, K) || !sl_cuda_moe_mm_fits(form, out, a, b, E, K, N, ws))
		return false;
	sl_cuda_moe_mm_rows(c->stream, form, out, a, b, h_offs, E, K, N, ws, 0);
	return true;
}
