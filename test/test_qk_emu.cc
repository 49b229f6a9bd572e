/*
 * test_qk_emu: the Qwen3 q/k RMSNorm + rotary kernels of cuda/qknorm.cuh (the warp-per-row
 * kernels of head_dim 64, 128 and 256; the staged kernels, whose tokens come into shared memory
 * by cp.async several tokens ahead, lanes holding consecutive elements, a rotary partner from
 * lane ^ 16; and the block-per-token kernels of any even head_dim) run on the host emulation (emu_run.h), against a double-precision norm + rotary
 * computed here; the reference backward is itself checked against central differences of the
 * reference forward.  Row counts that are no multiple of a block's rows, a grid of fewer blocks
 * than rows (warps walking several), packed rows' positions and the rotary angle computed without
 * the table each appear.  Outputs start as NaN, so one nothing wrote shows.
 */
#define SL_EMU 1
#include <cmath>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/qknorm.cuh"
#include "cdiff.h"
#include "testutil.h"
#include "testrng.h"

#include "emu_run.h"

namespace {

double bv(bf16 x)
{
	return (double)__bfloat162float(x);
}

struct Prob {
	int T, L, nh, nkv, hd;
	float eps, theta;
	std::vector<int> pos;	// packed rows' positions, or empty (t % L)
	std::vector<bf16> qkv, qw, kw, dout;
	int nj() const { return nh + 2 * nkv; }
	int p(int t) const { return pos.empty() ? t % L : pos[t]; }
};

// one head's row through norm and rotary, in double: y = rope(x r w), r = 1 / rms(x)
void ref_row(const Prob &P, const double *x, const double *w, int p, double *y, double *r)
{
	const int hd = P.hd, half = hd / 2;
	double ss = 0, n[256];

	for (int i = 0; i < hd; i++)
		ss += x[i] * x[i];
	*r = 1.0 / sqrt(ss / hd + P.eps);
	for (int i = 0; i < hd; i++)
		n[i] = x[i] * *r * w[i];
	for (int i = 0; i < half; i++) {
		const double a = p * pow((double)P.theta, -2.0 * i / hd), c = cos(a), s = sin(a);

		y[i] = n[i] * c - n[i + half] * s;
		y[i + half] = n[i + half] * c + n[i] * s;
	}
}

// its backward by hand: dn = rope^T dy; x^ = x r; dx = r (w dn - x^ mean(w dn x^)); dw += dn x^
void ref_row_bwd(const Prob &P, const double *x, const double *w, int p, const double *dy,
		 double *dx, double *dw)
{
	const int hd = P.hd, half = hd / 2;
	double ss = 0, dn[256], m = 0;

	for (int i = 0; i < hd; i++)
		ss += x[i] * x[i];
	const double r = 1.0 / sqrt(ss / hd + P.eps);

	for (int i = 0; i < half; i++) {
		const double a = p * pow((double)P.theta, -2.0 * i / hd), c = cos(a), s = sin(a);

		dn[i] = dy[i] * c + dy[i + half] * s;
		dn[i + half] = dy[i + half] * c - dy[i] * s;
	}
	for (int i = 0; i < hd; i++)
		m += w[i] * dn[i] * x[i] * r / hd;
	for (int i = 0; i < hd; i++) {
		dx[i] = r * (w[i] * dn[i] - x[i] * r * m);
		dw[i] += dn[i] * x[i] * r;
	}
}

// the reference backward against central differences of the reference forward (one row)
void check_ref(const Prob &P)
{
	const int hd = P.hd;
	std::vector<double> x(hd), w(hd), dy(hd), dx(hd), dw(hd, 0), y(hd);
	double r, ex = 0, mx = 0, ew = 0, mw = 0;

	for (int i = 0; i < hd; i++) {
		x[i] = rng_normal();
		w[i] = 1 + 0.3 * rng_normal();
		dy[i] = rng_normal();
	}
	ref_row_bwd(P, x.data(), w.data(), 7, dy.data(), dx.data(), dw.data());
	auto loss = [&](void) {
		double l = 0;

		ref_row(P, x.data(), w.data(), 7, y.data(), &r);
		for (int i = 0; i < hd; i++)
			l += dy[i] * y[i];
		return l;
	};
	for (int i = 0; i < hd; i++) {
		ex = fmax(ex, fabs(central_diff(x[i], loss) - dx[i]));
		mx = fmax(mx, fabs(dx[i]));
		ew = fmax(ew, fabs(central_diff(w[i], loss) - dw[i]));
		mw = fmax(mw, fabs(dw[i]));
	}
	CHECK(ex <= 1e-6 * mx && ew <= 1e-6 * mw,
	      "reference backward hd %d against differences: dx %.3g of %.3g, dw %.3g of %.3g", hd,
	      ex, mx, ew, mw);
}

// the rotary table as norm_dw.cuh's rope_table lays it out: cos (p, i) at p hd + i, sin at
// p hd + hd/2 + i (float angles from double)
std::vector<float> table(const Prob &P, int npos)
{
	std::vector<float> tab((size_t)npos * P.hd);

	for (int p = 0; p < npos; p++)
		for (int i = 0; i < P.hd / 2; i++) {
			const double a = p * pow((double)P.theta, -2.0 * i / P.hd);

			tab[(size_t)p * P.hd + i] = (float)cos(a);
			tab[(size_t)p * P.hd + P.hd / 2 + i] = (float)sin(a);
		}
	return tab;
}

// kind 1, the warp-per-row kernels (the forward's grid as ops.cu's launcher makes it, the backward
// of `nchunk` blocks); 2, the staged kernels, forward and backward of `nchunk` blocks; 0, the
// block-per-token kernels and the norm weights' first pass
enum { BLOCK, WARP, STAGED };
void check(Prob P, bool use_tab, int kind, int nchunk, const char *what)
{
	const int T = P.T, hd = P.hd, nj = P.nj(), nq = P.nh + P.nkv, W = nj * hd;
	const size_t rows = (size_t)T * nj, n = rows * hd;
	std::vector<double> rout(n), rrs((size_t)T * nq), rdx(n), rdqw(hd, 0), rdkw(hd, 0);
	std::vector<bf16> out(n), dqkv(n);
	std::vector<float> rs((size_t)T * nq);
	double eo = 0, mo = 0, er = 0, ed = 0, md = 0, ew = 0, mw = 0;
	bool nan = false;

	P.qkv.resize(n);
	P.dout.resize(n);
	P.qw.resize(hd);
	P.kw.resize(hd);
	for (auto &v : P.qkv)
		v = __float2bfloat16_rn((float)(2 * rng_normal()));
	for (auto &v : P.dout)
		v = __float2bfloat16_rn((float)rng_normal());
	for (int i = 0; i < hd; i++) {
		P.qw[i] = __float2bfloat16_rn((float)(1 + 0.3 * rng_normal()));
		P.kw[i] = __float2bfloat16_rn((float)(1 + 0.3 * rng_normal()));
	}
	for (int t = 0; t < T; t++)
		for (int j = 0; j < nj; j++) {
			const size_t off = (size_t)t * W + (size_t)j * hd;
			double x[256], w[256], dy[256];

			for (int i = 0; i < hd; i++) {
				x[i] = bv(P.qkv[off + i]);
				dy[i] = bv(P.dout[off + i]);
				w[i] = bv(j < P.nh ? P.qw[i] : P.kw[i]);
			}
			if (j >= nq) {	// v heads pass through
				for (int i = 0; i < hd; i++) {
					rout[off + i] = x[i];
					rdx[off + i] = dy[i];
				}
				continue;
			}
			ref_row(P, x, w, P.p(t), &rout[off], &rrs[(size_t)t * nq + j]);
			ref_row_bwd(P, x, w, P.p(t), dy, &rdx[off], j < P.nh ? rdqw.data() : rdkw.data());
		}

	int npos = P.L;

	for (int v : P.pos)
		npos = v + 1 > npos ? v + 1 : npos;
	const std::vector<float> tabv = table(P, npos);
	const int nblk_w = (int)((rows + QK_FWD_ROWS - 1) / QK_FWD_ROWS);
	const int nparts = kind != BLOCK ? nchunk : (T + 31) / 32;
	std::vector<float> part((size_t)2 * nparts * hd, NAN);

	for (auto &v : out)
		v = __float2bfloat16_rn(NAN);
	for (auto &v : dqkv)
		v = __float2bfloat16_rn(NAN);
	for (auto &v : rs)
		v = NAN;
	{
		bf16 *o = out.data(), *d = dqkv.data();
		float *r = rs.data(), *pa = part.data();
		const bf16 *x = P.qkv.data(), *qw = P.qw.data(), *kw = P.kw.data(), *g = P.dout.data();
		const float *tab = use_tab ? tabv.data() : nullptr;
		const int *pos = P.pos.empty() ? nullptr : P.pos.data();
		const int L = P.L, nh = P.nh, nkv = P.nkv;
		const float eps = P.eps, th = P.theta;

		if (kind == STAGED) {
			const size_t sf = QK_STAGES * qk_stage_bytes(nh, nkv, hd, false);
			const size_t sb = QK_STAGES * qk_stage_bytes(nh, nkv, hd, true);

			launch({ (unsigned)nchunk, 1, 1 }, QK_WARPS * 32, sf, [=] {
				if (hd == 64)
					k_qk_norm_rope_fwd_s<64>(o, r, x, qw, kw, tab, T, L, pos, nh, nkv,
								 eps);
				else if (hd == 128)
					k_qk_norm_rope_fwd_s<128>(o, r, x, qw, kw, tab, T, L, pos, nh,
								  nkv, eps);
				else
					k_qk_norm_rope_fwd_s<256>(o, r, x, qw, kw, tab, T, L, pos, nh,
								  nkv, eps);
			});
			launch({ (unsigned)nchunk, 1, 1 }, QK_WARPS * 32, sb, [=] {
				if (hd == 64)
					k_qk_norm_rope_bwd_s<64>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								 nh, nkv);
				else if (hd == 128)
					k_qk_norm_rope_bwd_s<128>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								  nh, nkv);
				else
					k_qk_norm_rope_bwd_s<256>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								  nh, nkv);
			});
		} else if (kind == WARP) {
			launch({ (unsigned)nblk_w, 1, 1 }, QK_WARPS * 32, 0, [=] {
				if (hd == 64)
					k_qk_norm_rope_fwd_w<64>(o, r, x, qw, kw, tab, T, L, pos, nh, nkv,
								 eps, th);
				else if (hd == 128)
					k_qk_norm_rope_fwd_w<128>(o, r, x, qw, kw, tab, T, L, pos, nh,
								  nkv, eps, th);
				else
					k_qk_norm_rope_fwd_w<256>(o, r, x, qw, kw, tab, T, L, pos, nh,
								  nkv, eps, th);
			});
			launch({ (unsigned)nchunk, 1, 1 }, QK_WARPS * 32, 0, [=] {
				if (hd == 64)
					k_qk_norm_rope_bwd_w<64>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								 nh, nkv, th);
				else if (hd == 128)
					k_qk_norm_rope_bwd_w<128>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								  nh, nkv, th);
				else
					k_qk_norm_rope_bwd_w<256>(d, pa, g, x, qw, kw, r, tab, T, L, pos,
								  nh, nkv, th);
			});
		} else {
			// the launcher's shapes: a block a token; the first pass over chunks of 32
			// tokens with R = 256 / hd token lanes (at least 1)
			const int R = 256 / hd > 0 ? 256 / hd : 1;

			launch({ (unsigned)T, 1, 1 }, QK_WARPS * 32, 0, [=] {
				k_qk_norm_rope_fwd(o, r, x, qw, kw, tab, L, pos, nh, nkv, hd, eps, th);
			});
			launch({ (unsigned)T, 1, 1 }, QK_WARPS * 32, 0, [=] {
				k_qk_norm_rope_bwd(d, g, x, qw, kw, r, tab, L, pos, nh, nkv, hd, th);
			});
			launch({ (unsigned)nparts, 2, 1 }, 0, (size_t)R * hd * 4, [=] {
				k_qk_dw_partial(pa, g, x, r, tab, T, L, pos, nh, nkv, hd, th, 32);
			}, { (unsigned)hd, (unsigned)R, 1 });
		}
	}
	for (size_t i = 0; i < n; i++) {
		nan |= !std::isfinite(bv(out[i])) || !std::isfinite(bv(dqkv[i]));
		eo = fmax(eo, fabs(bv(out[i]) - rout[i]));
		mo = fmax(mo, fabs(rout[i]));
		ed = fmax(ed, fabs(bv(dqkv[i]) - rdx[i]));
		md = fmax(md, fabs(rdx[i]));
	}
	for (size_t i = 0; i < rs.size(); i++) {
		nan |= !std::isfinite(rs[i]);
		er = fmax(er, fabs(rs[i] - rrs[i]) / rrs[i]);
	}
	for (int kind = 0; kind < 2; kind++)
		for (int i = 0; i < hd; i++) {
			double s = 0;

			for (int b = 0; b < nparts; b++)
				s += part[((size_t)kind * nparts + b) * hd + i];
			nan |= !std::isfinite(s);
			ew = fmax(ew, fabs(s - (kind ? rdkw : rdqw)[i]));
			mw = fmax(mw, fabs((kind ? rdkw : rdqw)[i]));
		}
	CHECK(!nan && eo <= 1e-2 * mo && er <= 1e-5 && ed <= 1e-2 * md && ew <= 1e-4 * mw,
	      "qk %s T %d hd %d h %d/%d: out %.3g of %.3g, rstd %.3g, dqkv %.3g of %.3g, dw %.3g of "
	      "%.3g%s", what, T, hd, P.nh, P.nkv, eo, mo, er, ed, md, ew, mw,
	      nan ? ", not finite (something unwritten)" : "");
	printf("qk %-28s T %2d hd %3d h %d/%d: out %.1e, rstd %.1e, dqkv %.1e, dw %.1e (relative)\n",
	       what, T, hd, P.nh, P.nkv, eo / mo, er, ed / md, ew / mw);
}

Prob prob(int T, int L, int nh, int nkv, int hd)
{
	Prob P;

	P.T = T;
	P.L = L;
	P.nh = nh;
	P.nkv = nkv;
	P.hd = hd;
	P.eps = 1e-6f;
	P.theta = 10000.f;
	return P;
}

} // namespace

int main(void)
{
	for (int hd : { 64, 128, 256 })
		check_ref(prob(1, 8, 1, 1, hd));

	// 10 tokens x 8 heads = 80 rows: three blocks of 32, the last part empty; the backward
	// at the launcher's grid (80 / 64 -> 2) and at one block (each warp walking 3 groups)
	check(prob(10, 5, 4, 2, 128), true, WARP, 2, "warp, table");
	check(prob(10, 5, 4, 2, 128), true, WARP, 1, "warp, one backward block");
	// 7 packed tokens x 5 heads = 35 rows (no multiple of a block's 8), angles without the table
	{
		Prob P = prob(7, 4, 3, 1, 64);

		P.pos = { 0, 1, 2, 0, 1, 2, 3 };
		check(P, false, WARP, 3, "warp, packed, no table");
		check(P, true, WARP, 1, "warp, packed, table");
		check(P, true, STAGED, 2, "staged, packed");
	}
	check(prob(3, 3, 2, 1, 256), true, WARP, 1, "warp, hd 256");
	// the staged kernels: blocks walking several tokens (the stages wrapping around), a grid
	// of one token a block, hd 64 and 256; 3 q heads + 1 k head: rstd of 4 floats, and 5 + 2
	// (7, no multiple of 4: the stage's rstd part padded)
	check(prob(10, 5, 4, 2, 128), true, STAGED, 3, "staged, 3 blocks");
	check(prob(10, 5, 4, 2, 128), true, STAGED, 1, "staged, one block");
	check(prob(4, 4, 4, 2, 128), true, STAGED, 4, "staged, a block a token");
	check(prob(9, 9, 3, 1, 64), true, STAGED, 2, "staged, hd 64");
	check(prob(5, 5, 5, 2, 64), true, STAGED, 2, "staged, 7 rstd");
	check(prob(3, 3, 2, 1, 256), true, STAGED, 2, "staged, hd 256");
	// the block-per-token kernels (any even head_dim; here 96 and 64)
	check(prob(5, 5, 3, 1, 96), true, BLOCK, 0, "block, table");
	{
		Prob P = prob(6, 6, 2, 2, 64);

		P.pos = { 4, 5, 0, 1, 2, 3 };
		check(P, false, BLOCK, 0, "block, packed, no table");
	}
	return test_exit("test_qk_emu");
}
