/*
 * test_fa_emu: the warpgroup flash-attention kernels of cuda/flash.cuh run on the host, on an
 * emulation of the instructions they use (cuda/emu.cuh), against a double-precision attention
 * computed here: the forward (k_fa_fwd_pipe, k_fa_fwd), the dq kernel and the dk/dv kernel (each
 * with its pipelined and unpipelined tiles) and the fused dq (SHARDLM_FA_BWD_DQ=fused: the dk/dv kernel
 * adding dQ into fp32 sums; =wg2: the same on two warpgroups of 64 keys fed by a loader warpgroup through mbarriers, head_dim 128, run with the scheduler's jitter) and
 * dq from stored dS (=ds: the dk/dv kernel writes dS^T tiles into a buffer that starts as NaN,
 * k_fa_dq_ds multiplies them by the keys; one and two heads a block; the tiles stored by the
 * threads or by bulk copies), at head_dim 64 and 128 (and 256: two warpgroups a block; neither
 * the pipelined forward nor the fused dq exist there), grouped-query heads, records shorter than
 * the row, packed rows, lengths that are no multiple of the tiles.
 *
 * The emulator (emu_run.h) models the hardware from the PTX ISA, independently of the kernels;
 * outputs start as NaN, so an output nothing wrote shows.
 * The first checks are the kernels that already passed on the H200 (test_cuda_ops): they check
 * the emulator.  The fused dq had not run on a GPU when this test was written.
 */
#define SL_EMU 1
#include <cmath>
#include <cstring>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/flash.cuh"
#include "testutil.h"
#include "testrng.h"

#include "emu_run.h"

namespace {

// ---- the reference (double) and the comparisons --------------------------------------------

struct Prob {
	int B, L, nh, nkv, hd;
	std::vector<int> lens, pos;	// pos: packed rows' positions in their documents, or empty
	std::vector<bf16> qkv, dout;
	// reference: out (B L, nh hd), lse (B L nh), dqkv (B L, (nh + 2 nkv) hd)
	std::vector<double> out, lse, dq, dk, dv;
	int W() const { return (nh + 2 * nkv) * hd; }
};

float rbf(float x)
{
	return __bfloat162float(__float2bfloat16_rn(x));
}

void make(Prob &p, int B_, int L, int nh, int nkv, int hd, std::vector<int> lens, uint64_t seed)
{
	p.B = B_, p.L = L, p.nh = nh, p.nkv = nkv, p.hd = hd, p.lens = lens;
	rng_state = 88172645463325252ull ^ (seed * 0x9E3779B97F4A7C15ull);
	p.qkv.resize((size_t)B_ * L * p.W());
	p.dout.resize((size_t)B_ * L * nh * hd);
	for (auto &v : p.qkv)
		v = __float2bfloat16_rn((float)rng_normal());
	for (auto &v : p.dout)
		v = __float2bfloat16_rn((float)rng_normal() * 0.5f);
}

double q_at(const Prob &p, int b, int i, int h, int d)
{
	return bfv(&p.qkv[((size_t)b * p.L + i) * p.W() + (size_t)h * p.hd + d]);
}

double k_at(const Prob &p, int b, int j, int kv, int d)
{
	return bfv(&p.qkv[((size_t)b * p.L + j) * p.W() + (size_t)(p.nh + kv) * p.hd + d]);
}

double v_at(const Prob &p, int b, int j, int kv, int d)
{
	return bfv(&p.qkv[((size_t)b * p.L + j) * p.W() + (size_t)(p.nh + p.nkv + kv) * p.hd + d]);
}

// causal attention per record and head, its backward with D from the reference out
void reference(Prob &p)
{
	const int L = p.L, hd = p.hd, grp = p.nh / p.nkv, W = p.W();
	const double scale = 1.0 / sqrt((double)hd);

	p.out.assign((size_t)p.B * L * p.nh * hd, 0);
	p.lse.assign((size_t)p.B * L * p.nh, 0);
	p.dq.assign((size_t)p.B * L * W, 0);
	for (int b = 0; b < p.B; b++)
		for (int h = 0; h < p.nh; h++) {
			const int kv = h / grp, len = p.lens[b];

			for (int i = 0; i < len; i++) {
				std::vector<double> s(i + 1), P(i + 1), dp(i + 1);
				double mx = -1e300, sum = 0, Dd = 0;
				const size_t orow = ((size_t)b * L + i) * p.nh + h;
				const int j0 = p.pos.empty() ? 0 : i - p.pos[(size_t)b * L + i];

				for (int j = 0; j < j0; j++)
					P[j] = dp[j] = 0;
				for (int j = j0; j <= i; j++) {
					double t = 0;

					for (int d = 0; d < hd; d++)
						t += q_at(p, b, i, h, d) * k_at(p, b, j, kv, d);
					s[j] = t * scale;
					mx = fmax(mx, s[j]);
				}
				for (int j = j0; j <= i; j++)
					sum += P[j] = exp(s[j] - mx);
				for (int j = j0; j <= i; j++)
					P[j] /= sum;
				p.lse[orow] = mx + log(sum);
				for (int d = 0; d < hd; d++) {
					double o = 0;

					for (int j = 0; j <= i; j++)
						o += P[j] * v_at(p, b, j, kv, d);
					p.out[orow * hd + d] = o;
					Dd += o * bfv(&p.dout[orow * hd + d]);
				}
				for (int j = 0; j <= i; j++) {
					double t = 0;

					for (int d = 0; d < hd; d++)
						t += bfv(&p.dout[orow * hd + d]) * v_at(p, b, j, kv, d);
					dp[j] = P[j] * (t - Dd);	// dS
				}
				for (int j = 0; j <= i; j++)
					for (int d = 0; d < hd; d++) {
						const size_t ri = ((size_t)b * L + i) * W, rj =
							((size_t)b * L + j) * W;

						p.dq[ri + (size_t)h * hd + d] +=
							scale * dp[j] * k_at(p, b, j, kv, d);
						p.dq[rj + (size_t)(p.nh + kv) * hd + d] +=
							scale * dp[j] * q_at(p, b, i, h, d);
						p.dq[rj + (size_t)(p.nh + p.nkv + kv) * hd + d] +=
							P[j] * bfv(&p.dout[orow * hd + d]);
					}
			}
		}
}

// got (bf16 or float) against want over n elements: the largest error over the largest value
template <class T>
void compare(const char *what, const Prob &p, const T *got, const std::vector<double> &want,
	     double tol)
{
	double err = 0, mx = 0;
	size_t bad = 0, at = 0;

	for (size_t i = 0; i < want.size(); i++) {
		double g;

		if constexpr (sizeof(T) == 2)
			g = bfv(&got[i]);
		else
			g = got[i];
		if (!std::isfinite(g)) {
			bad++;
			continue;
		}
		if (fabs(g - want[i]) > err)
			err = fabs(g - want[i]), at = i;
		mx = fmax(mx, fabs(want[i]));
	}
	CHECK(!bad && err <= tol * mx, "%s (hd %d, %d/%d heads, L %d): %zu not finite, largest "
	      "error %.3g at %zu (largest value %.3g)", what, p.hd, p.nh, p.nkv, p.L, bad, err, at,
	      mx);
	printf("%-44s hd %3d L %3d: error %.2e of %.2e%s\n", what, p.hd, p.L, err, mx,
	       bad ? " (not finite)" : "");
}

// the kernels' forward: out (bf16), lse (float)
template <int HD> void run_fwd(const Prob &p, bool pipe, std::vector<bf16> &out,
			       std::vector<float> &lse, const int *lens)
{
	const int *pos = p.pos.empty() ? nullptr : p.pos.data();
	using C = fa_cfg<HD, true>;
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
	bf16 *o = out.data();
	float *l = lse.data();
	const bf16 *qkv = p.qkv.data();
	const int L = p.L, nh = p.nh, nkv = p.nkv;

	for (auto &v : out)
		v = __float2bfloat16_rn(NAN);
	for (auto &v : lse)
		v = NAN;
	if constexpr (HD <= 128) {	// (the pipelined forward is for head_dim 64 and 128)
		if (pipe) {
			launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nh, (unsigned)p.B },
			       FA_THR, fa_smem_fwd<HD, true>(), [=] {
				       k_fa_fwd_pipe<HD>(o, l, qkv, lens, pos, L, nh, nkv, sl2);
			       });
			return;
		}
	}
	launch({ (unsigned)((L + C::BMQ - 1) / C::BMQ), (unsigned)nh, (unsigned)p.B }, C::NT,
	       fa_smem_fwd<HD, true>(), [=] {
		       k_fa_fwd<HD, false, true>(o, l, qkv, lens, pos, L, nh, nkv, sl2, fa_rows{});
	       });
}

template <int HD, bool F2> void fused_bwd(const Prob &p, bf16 *dq, const bf16 *dout,
					   const float *ls, const float *Dp, const bf16 *qkv,
					   const int *lens, const int *pos);
template <int HD> void ds_bwd(const Prob &p, bool one, bool bulk, bf16 *dq, const bf16 *dout,
			      const float *ls, const float *Dp, const bf16 *qkv, const int *lens,
			      const int *pos);

// the backward (how): 0 dq + dk/dv kernels unpipelined, 1 both pipelined, 2 the pipelined dk/dv
// with the unpipelined dq, 3 the fused dq, 4 the two-warpgroup fused dq (head_dim 128); dqkv
// (bf16)
template <int HD> void run_bwd(const Prob &p, int how, const std::vector<bf16> &out,
			       const std::vector<float> &lse, std::vector<bf16> &dqkv,
			       const int *lens)
{
	const int *pos = p.pos.empty() ? nullptr : p.pos.data();
	using C = fa_cfg<HD, true>;
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
	const float scale = (float)(1.0 / sqrt((double)HD));
	const int L = p.L, nh = p.nh, nkv = p.nkv, B_ = p.B;
	std::vector<float> D((size_t)B_ * L * nh);
	bf16 *dq = dqkv.data();
	const bf16 *dout = p.dout.data(), *qkv = p.qkv.data();
	const float *ls = lse.data(), *Dp;

	for (size_t r = 0; r < D.size(); r++) {	// k_attn_dot: rowsum(dout * out)
		float s = 0.f;

		for (int d = 0; d < HD; d++)
			s += bfv(&p.dout[r * HD + d]) * bfv(&out[r * HD + d]);
		D[r] = s;
	}
	Dp = D.data();
	for (auto &v : dqkv)
		v = __float2bfloat16_rn(NAN);
	if (how < 3) {
		const bool pipe = how > 0, qpipe = how == 1;

		launch({ (unsigned)((L + C::BMQ - 1) / C::BMQ), (unsigned)nh, (unsigned)B_ }, C::NT,
		       fa_smem_dq<HD, true>(), [=] {
			       k_fa_dq<HD, false, true>(dq, dout, ls, Dp, qkv, lens, pos, L, nh,
							nkv, sl2, scale, fa_rows{}, qpipe);
		       });
		launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
		       fa_smem_dkdv<HD, true>(), [=] {
			       k_fa_dkdv<HD, false, true>(dq, nullptr, dout, ls, Dp, qkv, lens,
							  pos, L, nh, nkv, sl2, scale,
							  fa_rows{}, pipe, nullptr, 0);
		       });
		return;
	}
	if constexpr (HD <= 128) {	// (the fused dq is for head_dim 64 and 128)
		if (how == 3)
			fused_bwd<HD, false>(p, dq, dout, ls, Dp, qkv, lens, pos);
	}
	if constexpr (HD == 128) {	// (the two-warpgroup one for 128)
		if (how == 4)
			fused_bwd<HD, true>(p, dq, dout, ls, Dp, qkv, lens, pos);
	}
	if constexpr (HD <= 128) {
		if (how >= 5)
			ds_bwd<HD>(p, how == 6, how == 7, dq, dout, ls, Dp, qkv, lens, pos);
	}
}

// the dS path: k_fa_dkdv<GS> writes dS^T tiles into a buffer that starts as NaN (a tile the dq
// kernel reads that nothing wrote shows in a real row), then k_fa_dq_ds; one: one head a block
// (else two, where the group has an even count); bulk: the tiles by the copy engine's bulk copies
// (SHARDLM_FA_DS_BULK=1)
template <int HD> void ds_bwd(const Prob &p, bool one, bool bulk, bf16 *dq, const bf16 *dout,
			      const float *ls, const float *Dp, const bf16 *qkv, const int *lens,
			      const int *pos)
{
	using C = fa_cfg<HD, true>;
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
	const float scale = (float)(1.0 / sqrt((double)HD));
	const int L = p.L, nh = p.nh, nkv = p.nkv, B_ = p.B, T = (L + 63) / 64;
	std::vector<bf16> ds((size_t)B_ * nh * T * (T + 1) / 2 * FA_DS_TILE,
			     __float2bfloat16_rn(NAN));
	bf16 *g = ds.data();

	if (bulk)
		launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
		       fa_smem_dkdv<HD, true, false, 2>(), [=] {
			       k_fa_dkdv<HD, false, true, false, 2>(dq, nullptr, dout, ls, Dp, qkv,
								    lens, pos, L, nh, nkv, sl2, scale,
								    fa_rows{}, true, nullptr, 0, g);
		       });
	else
		launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
		       fa_smem_dkdv<HD, true>(), [=] {
			       k_fa_dkdv<HD, false, true, false, 1>(dq, nullptr, dout, ls, Dp, qkv,
								    lens, pos, L, nh, nkv, sl2, scale,
								    fa_rows{}, true, nullptr, 0, g);
		       });
	if (!one && (nh / nkv) % 2 == 0)
		launch({ (unsigned)T, (unsigned)(nh / 2), (unsigned)B_ }, 2 * FA_THR,
		       fa_smem_ds<HD, 2>(), [=] {
			       k_fa_dq_ds<HD, 2>(dq, g, qkv, lens, pos, L, nh, nkv, scale);
		       });
	else
		launch({ (unsigned)T, (unsigned)nh, (unsigned)B_ }, FA_THR, fa_smem_ds<HD, 1>(), [=] {
			k_fa_dq_ds<HD, 1>(dq, g, qkv, lens, pos, L, nh, nkv, scale);
		});
}

// the fused dq: sums (B nh HD, Lp) zeroed, then k_fa_dq_out's transpose and scale here
template <int HD, bool F2> void fused_bwd(const Prob &p, bf16 *dq, const bf16 *dout,
					   const float *ls, const float *Dp, const bf16 *qkv,
					   const int *lens, const int *pos)
{
	using C = fa_cfg<HD, true>;
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
	const float scale = (float)(1.0 / sqrt((double)HD));
	const int L = p.L, nh = p.nh, nkv = p.nkv, B_ = p.B;
	const int Lp = fa_dq_pitch(L);
	std::vector<float> dqa((size_t)B_ * nh * HD * Lp, 0.f);
	float *a = dqa.data();

	if constexpr (F2) {
		// the loader and the two multiplier warpgroups hand tiles to each other through
		// mbarriers: with the scheduler's jitter, any missing wait reads a tile too early
		emu_jitter = true;
		launch({ (unsigned)((L + 2 * FA_BM - 1) / (2 * FA_BM)), (unsigned)nkv, (unsigned)B_ },
		       3 * FA_THR, fa_smem_ws<HD>(), [=] {
			       k_fa_dkdv_ws<HD>(dq, dout, ls, Dp, qkv, lens, pos, L, nh, nkv, sl2,
						scale, fa_rows{}, a, Lp);
		       });
		emu_jitter = false;
	} else
		launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
		       fa_smem_dkdv<HD, true, true>(), [=] {
			       k_fa_dkdv<HD, false, true, true>(dq, nullptr, dout, ls, Dp, qkv,
								lens, pos, L, nh, nkv, sl2, scale,
								fa_rows{}, true, a, Lp);
		       });
	for (int b = 0; b < B_; b++)
		for (int r = 0; r < L; r++)
			for (int c = 0; c < nh * HD; c++)
				dq[((size_t)b * L + r) * p.W() + c] = __float2bfloat16_rn(
					dqa[((size_t)b * nh * HD + c) * Lp + r] * scale);
}

// padding rows' outputs are not compared (the reference leaves them 0; kernels may write
// anything there that the model ignores): copy the reference's zeros over them
template <class T> void mask_pad(const Prob &p, std::vector<T> &v, int per_row)
{
	for (int b = 0; b < p.B; b++)
		for (int r = p.lens[b]; r < p.L; r++)
			for (int c = 0; c < per_row; c++) {
				if constexpr (sizeof(T) == 2)
					v[((size_t)b * p.L + r) * per_row + c] = __float2bfloat16_rn(0.f);
				else
					v[((size_t)b * p.L + r) * per_row + c] = 0.f;
			}
}

// docs: packed rows' document lengths (each row's, in order; empty: whole rows)
template <int HD> void check(int B_, int L, int nh, int nkv, std::vector<int> lens, uint64_t seed,
			     std::vector<std::vector<int>> docs = {})
{
	Prob p;
	std::vector<bf16> out((size_t)B_ * L * nh * HD), dqkv, piped;
	std::vector<float> lse((size_t)B_ * L * nh);
	const int *ln;

	make(p, B_, L, nh, nkv, HD, lens, seed);
	if (!docs.empty()) {
		p.pos.assign((size_t)B_ * L, 0);
		for (int b = 0; b < B_; b++) {
			int i = 0;

			for (int n : docs[b])
				for (int t = 0; t < n && i < L; t++)
					p.pos[(size_t)b * L + i++] = t;
		}
	}
	reference(p);
	ln = p.lens.data();
	dqkv.resize(p.qkv.size());
	for (int pipe = HD <= 128; pipe >= 0; pipe--) {
		run_fwd<HD>(p, pipe, out, lse, ln);
		mask_pad(p, out, nh * HD);
		mask_pad(p, lse, nh);
		compare(pipe ? "forward (k_fa_fwd_pipe): out" : "forward (k_fa_fwd): out", p,
			out.data(), p.out, 2e-2);
		compare(pipe ? "forward (k_fa_fwd_pipe): lse" : "forward (k_fa_fwd): lse", p,
			lse.data(), p.lse, 1e-3);
	}
	for (int how = 0; how < (HD <= 128 ? 8 : 3); how++) {
		static const char *name[] = { "backward (dq, dk/dv unpipelined): dqkv",
					      "backward (dq, dk/dv pipelined): dqkv",
					      "backward (dq unpipelined, dk/dv pipelined): dqkv",
					      "backward (fused dq): dqkv",
					      "backward (fused dq, two warpgroups): dqkv",
					      "backward (dS path): dqkv",
					      "backward (dS path, one head a block): dqkv",
					      "backward (dS path, bulk copies): dqkv" };

		if (how == 4 && HD != 128)	// (the two-warpgroup fused dq: head_dim 128)
			continue;
		run_bwd<HD>(p, how, out, lse, dqkv, ln);
		mask_pad(p, dqkv, p.W());
		compare(name[how], p, dqkv.data(), p.dq, 3e-2);
		// the pipelined tiles make the same sums in the same order: the same bits
		if (how == 1)
			piped = dqkv;
		if (how == 2)
			CHECK(!memcmp(piped.data(), dqkv.data(), dqkv.size() * sizeof(bf16)),
			      "hd %d L %d: the pipelined dq kernel's dq differs from the "
			      "unpipelined one's", HD, L);
	}
}

} // namespace

int main(void)
{
	/* two records, the second shorter, lengths no multiple of 64; query heads over kv heads */
	check<64>(2, 150, 2, 1, { 150, 97 }, 1);
	check<128>(2, 130, 4, 1, { 130, 70 }, 2);
	/* one long record: many key tiles, the online softmax's rescaling */
	check<128>(1, 260, 1, 1, { 260 }, 3);
	/* packed rows: documents starting inside tiles and sub-steps, one of 40 queries within a
	 * key block's first 64, one shorter than a sub-step */
	check<128>(2, 200, 2, 1, { 200, 181 }, 4, { { 45, 100, 55 }, { 70, 20, 91 } });
	check<64>(1, 256, 2, 1, { 256 }, 5, { { 96, 40, 120 } });
	/* head_dim 256 (Qwen3.5's gated attention): two warpgroups a block, 128 query rows, the dq
	 * kernel's 32-key tiles, dK and dV split over the warpgroups */
	check<256>(2, 140, 2, 1, { 140, 77 }, 6);
	return test_exit("test_fa_emu");
}
