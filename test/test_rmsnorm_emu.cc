/*
 * test_rmsnorm_emu: the staged RMSNorm backward of cuda/rmsnorm_s.cuh (rows into shared memory by
 * cp.async several rows ahead; dx, and the weight gradient's partials a block) run on the host
 * emulation (emu_run.h), against a double-precision backward computed here, itself checked
 * against central differences of the double forward.  Blocks walking several rows (the stages
 * wrapping around), one block, a block a row, rows of 8 to 2,560 elements (threads owning one or
 * two groups of 8, some none), dx written and accumulated.  Outputs start as NaN, so one nothing
 * wrote shows; a read of a stage before its copies landed reads the emulator's large value.
 */
#define SL_EMU 1
#include <cmath>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/rmsnorm_s.cuh"
#include "cdiff.h"
#include "testutil.h"
#include "testrng.h"

#include "emu_run.h"

namespace {

double bv(bf16 x)
{
	return (double)__bfloat162float(x);
}

const double EPS = 1e-6;

// y = x r w, r = 1 / sqrt(mean(x^2) + eps): the loss sum(dy y)'s gradients by hand
void ref_bwd(const double *x, const double *w, const double *dy, int H, double *dx, double *dw,
	     double *r_out)
{
	double ss = 0, m = 0;

	for (int i = 0; i < H; i++)
		ss += x[i] * x[i];
	const double r = 1.0 / sqrt(ss / H + EPS);

	for (int i = 0; i < H; i++)
		m += dy[i] * w[i] * x[i];
	for (int i = 0; i < H; i++) {
		dx[i] = r * w[i] * dy[i] - x[i] * r * r * r * m / H;
		dw[i] += dy[i] * x[i] * r;
	}
	*r_out = r;
}

void check_ref(int H)
{
	std::vector<double> x(H), w(H), dy(H), dx(H), dw(H, 0);
	double r, ex = 0, mx = 0, ew = 0, mw = 0;

	for (int i = 0; i < H; i++) {
		x[i] = rng_normal();
		w[i] = 1 + 0.3 * rng_normal();
		dy[i] = rng_normal();
	}
	ref_bwd(x.data(), w.data(), dy.data(), H, dx.data(), dw.data(), &r);
	auto loss = [&](void) {
		double ss = 0, l = 0;

		for (int i = 0; i < H; i++)
			ss += x[i] * x[i];
		const double rr = 1.0 / sqrt(ss / H + EPS);

		for (int i = 0; i < H; i++)
			l += dy[i] * x[i] * rr * w[i];
		return l;
	};
	for (int i = 0; i < H; i++) {
		ex = fmax(ex, fabs(central_diff(x[i], loss) - dx[i]));
		mx = fmax(mx, fabs(dx[i]));
		ew = fmax(ew, fabs(central_diff(w[i], loss) - dw[i]));
		mw = fmax(mw, fabs(dw[i]));
	}
	CHECK(ex <= 1e-6 * mx && ew <= 1e-6 * mw,
	      "reference backward H %d against differences: dx %.3g of %.3g, dw %.3g of %.3g", H, ex,
	      mx, ew, mw);
}

// T rows of H through k_rmsnorm_bwd_s on `grid` blocks of the launcher's threads
void check(int T, int H, int grid, bool acc)
{
	const size_t n = (size_t)T * H;
	std::vector<bf16> g(n), x(n), w(H), dx(n);
	std::vector<float> rstd(T), part((size_t)grid * H, NAN);
	std::vector<double> rdx(n), rdw(H, 0), old(n);
	double ed = 0, md = 0, ew = 0, mw = 0;
	bool nan = false;

	for (auto &v : g)
		v = __float2bfloat16_rn((float)rng_normal());
	for (auto &v : x)
		v = __float2bfloat16_rn((float)(2 * rng_normal()));
	for (auto &v : w)
		v = __float2bfloat16_rn((float)(1 + 0.3 * rng_normal()));
	for (size_t i = 0; i < n; i++) {
		dx[i] = __float2bfloat16_rn(acc ? (float)rng_normal() : NAN);
		old[i] = acc ? bv(dx[i]) : 0;
	}
	for (int t = 0; t < T; t++) {
		std::vector<double> xr(H), wr(H), gr(H);
		double r;

		for (int i = 0; i < H; i++) {
			xr[i] = bv(x[(size_t)t * H + i]);
			gr[i] = bv(g[(size_t)t * H + i]);
			wr[i] = bv(w[i]);
		}
		ref_bwd(xr.data(), wr.data(), gr.data(), H, &rdx[(size_t)t * H], rdw.data(), &r);
		rstd[t] = (float)r;
		for (int i = 0; i < H; i++)
			rdx[(size_t)t * H + i] += old[(size_t)t * H + i];
	}
	{
		bf16 *d = dx.data();
		float *pa = part.data();
		const bf16 *gp = g.data(), *xp = x.data(), *wp = w.data();
		const float *rp = rstd.data();
		const unsigned threads = ((H / 8 + RS_V - 1) / RS_V + 31) & ~31;

		launch({ (unsigned)grid, 1, 1 }, threads, RS_STAGES * rs_stage_bytes(H, acc), [=] {
			if (acc)
				k_rmsnorm_bwd_s<true>(d, pa, gp, xp, wp, rp, T, H);
			else
				k_rmsnorm_bwd_s<false>(d, pa, gp, xp, wp, rp, T, H);
		});
	}
	for (size_t i = 0; i < n; i++) {
		nan |= !std::isfinite(bv(dx[i]));
		ed = fmax(ed, fabs(bv(dx[i]) - rdx[i]));
		md = fmax(md, fabs(rdx[i]));
	}
	for (int i = 0; i < H; i++) {
		double s = 0;

		for (int b = 0; b < grid; b++)
			s += part[(size_t)b * H + i];
		nan |= !std::isfinite(s);
		ew = fmax(ew, fabs(s - rdw[i]));
		mw = fmax(mw, fabs(rdw[i]));
	}
	CHECK(!nan && ed <= 1e-2 * md && ew <= 1e-4 * mw,
	      "rmsnorm bwd T %d H %d grid %d%s: dx %.3g of %.3g, dw %.3g of %.3g%s", T, H, grid,
	      acc ? " accumulating" : "", ed, md, ew, mw,
	      nan ? ", not finite (something unwritten)" : "");
	printf("rmsnorm bwd T %2d H %4d grid %2d%-13s: dx %.1e, dw %.1e (relative)\n", T, H, grid,
	       acc ? " accumulating" : "", ed / md, ew / mw);
}

} // namespace

int main(void)
{
	for (int H : { 8, 64, 2560 })
		check_ref(H);
	check(10, 64, 3, true);		// 3 blocks walking 3-4 rows, 32 threads, 8 of them idle
	check(10, 64, 3, false);
	check(7, 256, 1, true);		// one block: the stages wrap around twice
	check(5, 8, 5, false);		// a block a row, one group of 8
	check(6, 2560, 4, true);	// the 4B's width: 160 threads, two groups each
	check(5, 2048, 2, false);	// the Qwen3-MoE's: 128 threads
	return test_exit("test_rmsnorm_emu");
}
