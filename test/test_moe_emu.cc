/*
 * test_moe_emu: the MoE permutation's kernels of cuda/permute.cuh (count, scan, write: the
 * choices sorted by expert, each expert's rows in token order), exactly against a counting sort
 * done here, on loads with empty experts, a partial last chunk and hundreds of experts; and the
 * MoE combine kernels of cuda/combine.cuh (the forward: a token's output is
 * the routing weights' sum of its chosen experts' rows; the backward: each chosen row's gradient
 * and each weight's) run on the host emulation (emu_run.h), against double sums computed here:
 * the 16-byte kernels at up to 8 choices and at more (their wider instance, loads in two
 * batches), widths of more words than threads, and the scalar kernels they replace where the
 * width is no multiple of 8.  Rows are a scattered permutation of the tokens' choices.
 */
#define SL_EMU 1
#include <cmath>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/combine.cuh"
#include "../cuda/permute.cuh"
#include "testutil.h"
#include "testrng.h"

#include "emu_run.h"

namespace {

float bv(bf16 x)
{
	return __bfloat162float(x);
}

// vec: the 16-byte kernels (threads: 8 columns each, whole warps, at most 256), else the scalar
void check(int T, int k, int H, bool vec, uint64_t seed)
{
	const int n = T * k, nthr = vec ? ((H / 8 + 31) / 32 * 32 < 256 ? (H / 8 + 31) / 32 * 32 : 256)
					: 256;
	std::vector<bf16> y((size_t)n * H), g((size_t)T * H), out((size_t)T * H), dy((size_t)n * H);
	std::vector<float> w(n), dw(n);
	std::vector<int> slot(n);
	std::vector<double> ro((size_t)T * H, 0), rdy((size_t)n * H, 0), rdw(n, 0);
	double eo = 0, ey = 0, ew = 0, mo = 0, my = 0, mw = 0;
	bool nan = false;

	rng_state = 88172645463325252ull ^ (seed * 0x9E3779B97F4A7C15ull);
	for (auto &v : y)
		v = __float2bfloat16_rn((float)rng_normal());
	for (auto &v : g)
		v = __float2bfloat16_rn((float)rng_normal());
	for (auto &v : w)
		v = (float)rng_unif();
	for (int i = 0; i < n; i++)	/* a permutation (the same row twice would race), shuffled */
		slot[i] = i;
	for (int i = n - 1; i > 0; i--) {
		const int j = (int)(rng_next() % (uint64_t)(i + 1)), t = slot[i];

		slot[i] = slot[j];
		slot[j] = t;
	}
	for (int t = 0; t < T; t++)
		for (int j = 0; j < k; j++) {
			const size_t r = (size_t)slot[(size_t)t * k + j];

			for (int h = 0; h < H; h++) {
				ro[(size_t)t * H + h] += (double)w[(size_t)t * k + j] * bv(y[r * H + h]);
				rdy[r * H + h] = (double)w[(size_t)t * k + j] * bv(g[(size_t)t * H + h]);
				rdw[(size_t)t * k + j] += (double)bv(g[(size_t)t * H + h]) *
							  bv(y[r * H + h]);
			}
		}
	for (auto &v : out)
		v = __float2bfloat16_rn(NAN);
	for (auto &v : dy)
		v = __float2bfloat16_rn(NAN);
	for (auto &v : dw)
		v = NAN;
	{
		bf16 *o = out.data(), *d = dy.data();
		const bf16 *yy = y.data(), *gg = g.data();
		const float *ww = w.data();
		float *dd = dw.data();
		const int *s = slot.data();

		launch({ (unsigned)T, 1, 1 }, nthr, 0, [=] {
			if (vec)
				k_combine_fwd8(o, yy, ww, s, k, H);
			else
				k_combine_fwd(o, yy, ww, s, k, H);
		});
		launch({ (unsigned)T, 1, 1 }, nthr, 0, [=] {
			if (!vec)
				k_combine_bwd(d, dd, gg, yy, ww, s, k, H);
			else if (k <= CB)
				k_combine_bwd8<CB>(d, dd, gg, yy, ww, s, k, H);
			else
				k_combine_bwd8<MAXK>(d, dd, gg, yy, ww, s, k, H);
		});
	}
	for (size_t i = 0; i < ro.size(); i++) {
		nan |= !std::isfinite(bv(out[i]));
		eo = fmax(eo, fabs(bv(out[i]) - ro[i]));
		mo = fmax(mo, fabs(ro[i]));
	}
	for (size_t i = 0; i < rdy.size(); i++) {
		nan |= !std::isfinite(bv(dy[i]));
		ey = fmax(ey, fabs(bv(dy[i]) - rdy[i]));
		my = fmax(my, fabs(rdy[i]));
	}
	for (int i = 0; i < n; i++) {
		nan |= !std::isfinite(dw[i]);
		ew = fmax(ew, fabs(dw[i] - rdw[i]));
		mw = fmax(mw, fabs(rdw[i]));
	}
	CHECK(!nan && eo <= 1e-2 * mo && ey <= 1e-2 * my && ew <= 1e-4 * mw,
	      "combine T %d k %d H %d %s: out %.3g of %.3g, dy %.3g of %.3g, dw %.3g of %.3g%s", T, k,
	      H, vec ? "16-byte" : "scalar", eo, mo, ey, my, ew, mw, nan ? ", not finite" : "");
	printf("combine T %3d k %2d H %4d %-8s: out %.1e, dy %.1e, dw %.1e (relative)\n", T, k, H,
	       vec ? "16-byte" : "scalar", eo / mo, ey / my, ew / mw);
}

// T tokens' k choices among E experts (@skew: half the choices to expert 1, experts 0 and E/2
// never chosen), sorted on the emulation against a stable counting sort
void check_permute(int T, int E, int k, bool skew, uint64_t seed)
{
	const int n = T * k, nch = (n + PERM_CH - 1) / PERM_CH;
	std::vector<int> topi(n), rows(n, -1), slot(n, -1), offs(E + 1, -1);
	std::vector<int> cnt((size_t)E * nch + E), rrows(n), rslot(n), roffs(E + 1, 0);
	int *tot = cnt.data() + (size_t)E * nch, bad = 0;

	rng_state = 88172645463325252ull ^ (seed * 0x9E3779B97F4A7C15ull);
	for (int i = 0; i < n; i++) {
		int e = (int)(rng_next() % (uint64_t)E);

		if (skew && (e == 0 || e == E / 2 || rng_next() % 2))
			e = 1;
		topi[i] = e;
	}
	for (int i = 0; i < n; i++)
		roffs[topi[i] + 1]++;
	for (int e = 0; e < E; e++)
		roffs[e + 1] += roffs[e];
	{
		std::vector<int> at(roffs.begin(), roffs.end() - 1);

		for (int i = 0; i < n; i++) {
			rslot[i] = at[topi[i]]++;
			rrows[rslot[i]] = i / k;
		}
	}
	int *pc = cnt.data(), *pt = tot, *pr = rows.data(), *ps = slot.data(), *po = offs.data();
	const int *pi = topi.data();

	launch({ (unsigned)nch, 1, 1 }, PERM_CH, E * sizeof(int),
	       [=] { k_perm_count(pc, pi, n, E, nch); });
	launch({ (unsigned)E, 1, 1 }, 256, 0, [=] { k_perm_scan(pc, pt, nch); });
	launch({ (unsigned)nch, 1, 1 }, PERM_CH, (PERM_CH / 32 + 1) * E * sizeof(int),
	       [=] { k_perm_write(pr, ps, po, pc, pt, pi, n, k, E, nch); });
	for (int i = 0; i < n; i++)
		bad += rows[i] != rrows[i] || slot[i] != rslot[i];
	for (int e = 0; e <= E; e++)
		bad += offs[e] != roffs[e];
	CHECK(!bad, "permute T %d E %d k %d%s: %d of %d rows, slots and offsets differ", T, E, k,
	      skew ? " skewed" : "", bad, 2 * n + E + 1);
	printf("permute T %4d E %4d k %d %-6s: %d chunks, %s\n", T, E, k, skew ? "skewed" : "",
	       nch, bad ? "FAIL" : "exact");
}

} // namespace

int main(void)
{
	check_permute(1, 4, 1, false, 5);	/* one choice */
	check_permute(300, 64, 8, true, 6);	/* 2400 choices: a partial last chunk, empty experts */
	check_permute(512, 64, 8, false, 7);	/* 16 whole chunks */
	check_permute(200, 300, 4, false, 8);	/* more experts than threads a block */
	check(12, 8, 2048, true, 1);	/* issue 8's width and choices */
	check(9, 12, 4104, true, 2);	/* 513 words, 256 threads; 12 choices: the wider kernel */
	check(7, 3, 24, true, 3);	/* fewer words than a warp */
	check(6, 8, 130, false, 4);	/* the scalar kernels */
	return test_exit("test_moe_emu");
}
