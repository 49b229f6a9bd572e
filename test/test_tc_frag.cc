/*
 * test_tc_frag: cuda/tc_mm.cuh's device branch (the tensor-core products of the chunked gated
 * delta rule: permuted fragments, vector loads, masks, epilogue) run on the host, its mma.sync
 * emulated from the PTX ISA's m16n8k8 tf32 fragment layouts:
 *   A (16 x 8, row):  a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
 *   B (8 x 8, col):   b0 (t, g), b1 (t + 4, g)
 *   C, D (16 x 8):    c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
 * for lane = 4g + t; a tf32 operand is its register's top 19 bits.  A warp runs twice, its
 * lanes one after the other: the first time each lane's mma operands are recorded; the warp's
 * products are made from them; the second time each lane's accumulators get its part.
 *
 * Every layout the kernels use (k-, m- and n-contiguous, strided, misaligned), each warp tile,
 * bf16 and float operands, column scales, row scales, alpha, accumulation into C and ragged
 * shapes, against a double product.  The operands are small multiples of 1/4 and the scales
 * powers of two, so the sums are exact: any element from the wrong place shows.  A second pass
 * with full-precision floats checks the rounding to tf32 (nearest, ties away).  Also: that the
 * vector paths ran where they should, and that nothing of C outside the product was written.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "testutil.h"

typedef struct {
	uint16_t x;
} bf16;

struct float2 {
	float x, y;
};
struct float4 {
	float x, y, z, w;
};
struct uint2 {
	unsigned x, y;
};
static struct {
	unsigned x;
} threadIdx;

static float bf(bf16 v)
{
	uint32_t u = (uint32_t)v.x << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static unsigned mm_bits(float x)
{
	unsigned u;

	memcpy(&u, &x, 4);
	return u;
}

static float mm_float(unsigned u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* the device's rounding to tf32 (to nearest, ties away from zero, for finite values): half the
 * unit of the 13 bits the mma ignores added */
static unsigned mm_tf32(float x)
{
	return mm_bits(x) + 0x1000u;
}

/* which operands tc_mm takes to be in shared memory (the device loads them by 32-bit shared
 * addresses; here the loads are the same): each case runs with none, A, and both */
static const void *sh_a, *sh_b;
static long sm_runs[3];

static bool mm_shared(const void *p)
{
	return p && (p == sh_a || p == sh_b);
}

/* the emulated warp: pass 0 records each lane's operands, pass 1 hands out its results */
static int emu_pass, emu_lane;
static std::vector<unsigned> emu_rec[32];	/* 6 registers a call */
static std::vector<float> emu_res[32];		/* 4 floats a call */
static size_t emu_next[32];

static void mm_mma(float *c, const unsigned *a, const unsigned *b)
{
	int L = emu_lane;

	if (emu_pass == 0) {
		for (int i = 0; i < 4; i++)
			emu_rec[L].push_back(a[i]);
		emu_rec[L].push_back(b[0]);
		emu_rec[L].push_back(b[1]);
		return;
	}
	for (int x = 0; x < 4; x++)
		c[x] += emu_res[L][4 * emu_next[L] + x];
	emu_next[L]++;
}

/* which mm_block instantiations ran: [TM - 1][TN / 2 - 1][LA][LB][CHK] */
static long paths[2][2][3][3][2];

static void tc_frag_path(int TM, int TN, int LA, int LB, bool CHK, int SM)
{
	paths[TM - 1][TN / 2 - 1][LA][LB][CHK]++;
	sm_runs[SM]++;
}

/* how the epilogue stored C: element by element, or a lane's run of columns as one vector */
static long store_runs[2];

static void tc_frag_store(bool vec)
{
	store_runs[vec]++;
}

#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define NTH 256
#define TC_MM_FRAG_HOST 1
#include "../cuda/tc_mm.cuh"

static float tf32v(unsigned r)
{
	return mm_float(r & ~0x1fffu);
}

/* the products of every mma the warp recorded, each lane's four accumulators */
static int emu_products(void)
{
	size_t n = emu_rec[0].size() / 6;

	for (int L = 0; L < 32; L++) {
		if (emu_rec[L].size() != 6 * n)
			return 0;	/* the lanes disagree on the number of mma calls */
		emu_res[L].assign(4 * n, 0.f);
	}
	for (size_t q = 0; q < n; q++) {
		double A[16][8], B[8][8];

		for (int L = 0; L < 32; L++) {
			const unsigned *r = &emu_rec[L][6 * q];
			int g = L >> 2, t = L & 3;

			A[g][t] = tf32v(r[0]);
			A[g + 8][t] = tf32v(r[1]);
			A[g][t + 4] = tf32v(r[2]);
			A[g + 8][t + 4] = tf32v(r[3]);
			B[t][g] = tf32v(r[4]);
			B[t + 4][g] = tf32v(r[5]);
		}
		for (int L = 0; L < 32; L++) {
			int g = L >> 2, t = L & 3;

			for (int x = 0; x < 4; x++) {
				int row = g + 8 * (x >> 1), col = 2 * t + (x & 1);
				double d = 0;

				for (int k = 0; k < 8; k++)
					d += A[row][k] * B[k][col];
				emu_res[L][4 * q + x] = (float)d;
			}
		}
	}
	return 1;
}

/* tc_mm by the block's eight warps, each emulated */
static int run_tc(int M, int N, int K, struct mmop A, struct mmop B, const float *sk,
		  const float *rs, float alpha, float cb, float *C, size_t csize, int crs, int ccs)
{
	std::vector<float> scratch(C, C + csize);

	for (int w = 0; w < NTH / 32; w++) {
		for (int L = 0; L < 32; L++)
			emu_rec[L].clear(), emu_next[L] = 0;
		emu_pass = 0;
		for (int L = 0; L < 32; L++) {
			emu_lane = L;
			threadIdx.x = (unsigned)(32 * w + L);
			tc_mm(M, N, K, A, B, sk, rs, alpha, cb, scratch.data(), crs, ccs);
		}
		if (!emu_products())
			return 0;
		emu_pass = 1;
		for (int L = 0; L < 32; L++) {
			emu_lane = L;
			threadIdx.x = (unsigned)(32 * w + L);
			tc_mm(M, N, K, A, B, sk, rs, alpha, cb, C, crs, ccs);
		}
	}
	return 1;
}

static uint64_t rng = 88172645463325252ull;

static unsigned rbits(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng >> 32);
}

/* exact: a multiple of 1/4 in [-4, 4]; else a full-precision float in (-1, 1) */
static float rval(bool exact)
{
	if (exact)
		return (float)((int)(rbits() % 33) - 16) / 4.f;
	return (float)(((double)rbits() / 4294967296.0) * 2 - 1);
}

static float pow2(void)
{
	static const float p[] = {0.25f, 0.5f, 1.f, 2.f, 4.f};

	return p[rbits() % 5];
}

static bf16 tobf(float f)	/* only for values bf16 holds exactly */
{
	bf16 r;

	r.x = (uint16_t)(mm_bits(f) >> 16);
	return r;
}

/* an operand's layout: row-major with padding (k- or n-contiguous), transposed (m- or
 * k-contiguous), or strided both ways; off elements into its buffer (1: misaligned) */
enum { ROWM, COLM, STRIDED };

struct opnd {
	std::vector<float> f;
	std::vector<bf16> b;
	int rs, cs, off;
	bool isbf;

	double at(int i, int j) const
	{
		size_t x = (size_t)off + (size_t)i * rs + (size_t)j * cs;

		return isbf ? bf(b[x]) : f[x];
	}
	struct mmop op() const
	{
		struct mmop o;

		o.p = isbf ? (const void *)(b.data() + off) : (const void *)(f.data() + off);
		o.rs = rs, o.cs = cs, o.bf = isbf;
		return o;
	}
};

static struct opnd make(int R, int Cc, int lay, int pad, int off, bool isbf, bool exact)
{
	struct opnd o;
	size_t n;

	o.isbf = isbf, o.off = off;
	if (lay == ROWM)
		o.rs = Cc + pad, o.cs = 1;
	else if (lay == COLM)
		o.rs = 1, o.cs = R + pad;
	else
		o.rs = 2, o.cs = 2 * R + 1;
	n = (size_t)off + (size_t)(R - 1) * o.rs + (size_t)(Cc - 1) * o.cs + 1;
	if (isbf) {
		o.b.resize(n);
		for (size_t i = 0; i < n; i++)	/* bf16 holds multiples of 1/4 up to 4 */
			o.b[i] = tobf(exact ? rval(true) : (float)(int)(rbits() % 255 - 127) / 64.f);
	} else {
		o.f.resize(n);
		for (size_t i = 0; i < n; i++)
			o.f[i] = rval(exact);
	}
	return o;
}

/* round to tf32 as the device does, for the reference of inexact operands */
static double rt(double v)
{
	return tf32v(mm_tf32((float)v));
}

struct tcase {
	int M, N, K;
	bool abf, bbf;
	int alay, blay, apad, bpad, aoff, boff;
	bool sk, rs;
	float alpha, cb;
	int want;	/* the path that must run: 0 masked, 1 vector loads */
};

static void one(const struct tcase &c, bool exact)
{
	struct opnd A = make(c.M, c.K, c.alay, c.apad, c.aoff, c.abf, exact);
	struct opnd B = make(c.K, c.N, c.blay, c.bpad, c.boff, c.bbf, exact);
	std::vector<float> sk(c.K), rs(c.M);
	static int cpad = 3;
	/* C with a gap after each row (3 or 4 wide: rows misaligned for vector stores or not), and
	 * a row more */
	const int crs = c.N + (cpad = 7 - cpad), ccs = 1;
	size_t csize = (size_t)(c.M + 1) * crs;
	std::vector<float> C(csize), C0;
	long before[2][2][3][3][2], ran_vec = 0, ran_chk = 0;
	double worst = 0;
	bool untouched = true;
	char what[160];

	for (int k = 0; k < c.K; k++)
		sk[k] = pow2();
	for (int m = 0; m < c.M; m++)
		rs[m] = pow2();
	for (size_t i = 0; i < csize; i++)
		C[i] = rval(true);
	C0 = C;
	static int sh_mode;

	memcpy(before, paths, sizeof(paths));
	sh_mode = (sh_mode + 1) % 3;
	sh_a = sh_mode ? A.op().p : NULL;
	sh_b = sh_mode == 2 ? B.op().p : NULL;
	snprintf(what, sizeof what,
		 "%dx%dx%d A %s%s pad %d off %d, B %s%s pad %d off %d%s%s alpha %g cb %g%s", c.M,
		 c.N, c.K, c.abf ? "bf16 " : "", c.alay == ROWM ? "row" : c.alay == COLM ? "col" :
		 "strided", c.apad, c.aoff, c.bbf ? "bf16 " : "", c.blay == ROWM ? "row" :
		 c.blay == COLM ? "col" : "strided", c.bpad, c.boff, c.sk ? " sk" : "",
		 c.rs ? " rs" : "", c.alpha, c.cb, exact ? "" : " (inexact)");
	CHECK(run_tc(c.M, c.N, c.K, A.op(), B.op(), c.sk ? sk.data() : NULL,
		     c.rs ? rs.data() : NULL, c.alpha, c.cb, C.data(), csize, crs, ccs),
	      "%s: the lanes of a warp made different numbers of mma calls", what);
	for (int m = 0; m < c.M; m++) {
		for (int n = 0; n < c.N; n++) {
			double s = 0, mag = 0, ref, got = C[(size_t)m * crs + n];
			double r = (double)c.alpha * (c.rs ? rs[m] : 1.f);
			double cc = c.cb != 0.f ? c.cb * C0[(size_t)m * crs + n] : 0.0;

			for (int k = 0; k < c.K; k++) {
				double a = A.at(m, k) * (c.sk ? sk[k] : 1.f);
				double p = (exact ? a : rt(a)) * (exact ? B.at(k, n) : rt(B.at(k, n)));

				s += p;
				mag += fabs(p);
			}
			ref = r * s + cc;
			mag = fabs(r) * mag + fabs(cc);
			if (exact) {
				if (got != ref && worst == 0)
					fprintf(stderr, "%s: C(%d, %d) = %.9g, not %.9g\n", what,
						m, n, got, ref);
				worst = got != ref ? 1 : worst;
			} else {
				double e = fabs(got - ref) / (mag + 1e-30);	/* fp32 sums */

				worst = e > worst ? e : worst;
			}
		}
		for (int n = c.N; n < crs; n++)
			untouched &= C[(size_t)m * crs + n] == C0[(size_t)m * crs + n];
	}
	for (int n = 0; n < crs; n++)
		untouched &= C[(size_t)c.M * crs + n] == C0[(size_t)c.M * crs + n];
	if (exact)
		CHECK(worst == 0, "%s: not exact", what);
	else
		CHECK(worst < 1e-6, "%s: error %g of the terms' magnitude", what, worst);
	CHECK(untouched, "%s: C written outside the product", what);
	for (int a = 0; a < 2; a++)
		for (int b = 0; b < 2; b++)
			for (int la = 0; la < 3; la++)
				for (int lb = 0; lb < 3; lb++) {
					long d = paths[a][b][la][lb][1] - before[a][b][la][lb][1];
					long v = paths[a][b][la][lb][0] - before[a][b][la][lb][0];

					ran_chk += d, ran_vec += v;
				}
	/* the vector path also wants C's rows (and start) aligned to the warp tile's run of
	 * columns (TN: 2 or 4 floats): the rows 3 floats apart go the masked way */
	const bool want = c.want && crs % 4 == 0 && (uintptr_t)C.data() % 16 == 0;

	CHECK(want ? ran_vec > 0 && !ran_chk : ran_chk > 0 && !ran_vec,
	      "%s, C rows %d apart: the %s path did not run (vector %ld, masked %ld)", what, crs,
	      want ? "vector" : "masked", ran_vec, ran_chk);
}

int main(void)
{
	/* the warp tiles: 64 x 128 -> 32 x 32; 64 x 64 -> 16 x 32; 16 x 48 -> 16 x 16 */
	static const int shapes[][3] = {{64, 128, 64}, {64, 64, 128}, {16, 48, 48}, {128, 128, 64},
					{16, 32, 16}, {64, 64, 64}};
	static const struct tcase odd[] = {
		/* ragged shapes: masked, any layout */
		{17, 23, 13, true, true, COLM, COLM, 0, 0, 0, 0, true, true, 0.5f, -2.f, 0},
		{5, 3, 4, false, false, ROWM, ROWM, 0, 0, 0, 0, false, false, 1.f, 0.f, 0},
		{64, 64, 60, false, true, ROWM, COLM, 4, 8, 0, 0, true, false, 1.f, 1.f, 0},
		{48, 40, 64, true, false, COLM, ROWM, 8, 4, 0, 0, false, true, -1.f, 0.f, 0},
		/* whole tiles but misaligned or strided operands: masked */
		{64, 128, 64, false, false, ROWM, ROWM, 4, 4, 1, 0, false, false, 1.f, 0.f, 0},
		{64, 128, 64, true, false, COLM, ROWM, 8, 4, 0, 1, true, false, 1.f, 0.f, 0},
		{64, 64, 64, false, false, ROWM, ROWM, 3, 4, 0, 0, false, false, 1.f, 0.f, 0},
		{64, 64, 64, false, true, STRIDED, ROWM, 0, 8, 0, 0, false, false, 1.f, 0.f, 0},
		{16, 48, 48, true, false, ROWM, STRIDED, 8, 0, 0, 0, true, true, 2.f, 0.5f, 0},
		/* k-contiguous B misaligned */
		{64, 128, 64, false, false, ROWM, COLM, 4, 8, 0, 1, false, false, 1.f, 0.f, 0},
		{64, 64, 64, true, true, ROWM, COLM, 4, 8, 0, 1, false, false, 1.f, 0.f, 0},
		/* m-contiguous A: a column stride not a multiple of 2 TM, or misaligned */
		{64, 128, 64, false, false, COLM, ROWM, 2, 4, 0, 0, false, false, 1.f, 0.f, 0},
		{64, 128, 64, true, true, COLM, ROWM, 4, 4, 2, 0, false, false, 1.f, 0.f, 0},
		{64, 128, 64, false, false, COLM, COLM, 4, 4, 2, 0, true, false, 1.f, 0.f, 0},
		/* n-contiguous B with a row stride not a multiple of TN: masked */
		{64, 128, 64, false, false, ROWM, ROWM, 4, 2, 0, 0, false, false, 1.f, 0.f, 0},
	};

	for (int exact = 1; exact >= 0; exact--) {
		for (const auto &s : shapes)
			for (int abf = 0; abf < 2; abf++)
				for (int bbf = 0; bbf < 2; bbf++)
					for (int al = ROWM; al <= COLM; al++)
						for (int bl = ROWM; bl <= COLM; bl++) {
							struct tcase c = {s[0], s[1], s[2],
									  abf != 0, bbf != 0,
									  al, bl, 4, 8, 0, 0,
									  (al + bl + abf) % 2 == 0,
									  al == bl,
									  al ? -1.f : 1.f,
									  bl ? 1.f : 0.f, 1};

							if (s[0] == 16 && s[1] == 32)
								c.apad = 8, c.bpad = 4,
								c.cb = 0.25f;
							one(c, exact != 0);
						}
		for (const auto &c : odd)
			one(c, exact != 0);
	}
	CHECK(store_runs[0] && store_runs[1], "both epilogues ran (by element %ld, by vector %ld)",
	      store_runs[0], store_runs[1]);
	CHECK(sm_runs[0] && sm_runs[1] && sm_runs[2],
	      "every shared-memory form ran (neither %ld, A %ld, both %ld)", sm_runs[0], sm_runs[1],
	      sm_runs[2]);
	return test_exit("test_tc_frag");
}
