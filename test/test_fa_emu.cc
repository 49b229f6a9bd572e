/*
 * test_fa_emu: the warpgroup flash-attention kernels of cuda/flash.cuh run on the host, on an
 * emulation of the instructions they use (cuda/emu.cuh), against a double-precision attention
 * computed here: the forward (k_fa_fwd_pipe, k_fa_fwd), the dq kernel and the dk/dv kernel (its
 * pipelined and unpipelined tiles) and the fused dq (SHARDLM_FA_BWD_DQ=fused: the dk/dv kernel
 * adding dQ into fp32 sums), at head_dim 64 and 128 (and 256: two warpgroups a block; neither
 * the pipelined forward nor the fused dq exist there), grouped-query heads, records shorter than
 * the row, packed rows, lengths that are no multiple of the tiles.
 *
 * The emulator: each thread of a block is a fiber (ucontext); barriers, shuffles and the
 * warpgroup's collective instructions switch between them.  Its model of the hardware, from the
 * PTX ISA, is independent of the kernels:
 *  - wgmma m64nNk16: the A fragment in registers as mma.sync m16n8k16 gives a warp its 16 rows
 *    (a0 (g, 2t..2t+1), a1 (g+8, ..), a2 (g, 2t+8..), a3 (g+8, 2t+8..) for lane 4g + t); D per
 *    8 columns (d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1)); an operand in shared
 *    memory through its matrix descriptor (start, leading and stride byte offsets, 128-byte
 *    swizzle: address bits 4-6 XOR bits 7-9), K-major (element (mn, k) at start + (mn / 8) SBO +
 *    (mn % 8) 128 + 2k) or MN-major (at start + (k / 8) SBO + (k % 8) 128 + (mn / 64) LBO +
 *    2 (mn % 64));
 *  - wgmma runs asynchronously: its products are made when a wait_group lets them finish, from
 *    the shared memory of that moment (registers as issued), so a kernel that changes a tile
 *    or reads an accumulator before waiting gets other numbers;
 *  - cp.async copies land when a wait_group lets them, not before;
 *  - shared memory starts each block filled with a large value, outputs with NaN: a read of
 *    what nothing wrote, or an output nothing wrote, shows.
 * The first checks are the kernels that already passed on the H200 (test_cuda_ops): they check
 * the emulator.  The fused dq had not run on a GPU when this test was written.
 */
#define SL_EMU 1
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/flash.cuh"
#include "testutil.h"
#include "testrng.h"

// every flash kernel's dynamic shared memory (declared extern inside each kernel)
alignas(1024) bf16 fa_sm[(228u << 10) / sizeof(bf16)];

emu_now_t *emu_now;

namespace {

struct Copy {
	uint32_t dst;
	const void *src;
	int bytes;
	bool valid;
};

struct Fiber {
	ucontext_t ctx;
	std::vector<char> stack;
	bool done;
	emu_now_t now;
	std::vector<Copy> open;
	std::deque<std::vector<Copy>> groups;
};

struct Coll {
	int count = 0;
	unsigned gen = 0;
};

struct WgOp {
	int n, acc, ta, tb;
	bool rs;
	uint64_t ad, bd;
	float *d[128];
	uint32_t a[128][4];
};

struct Wg {
	Coll c;
	WgOp building;
	std::vector<WgOp> open;
	std::deque<std::vector<WgOp>> groups;
};

struct Warp {
	Coll c;
	uint32_t slot[32];
};

struct Block {
	int nthr, cur;
	std::vector<Fiber> f;
	ucontext_t sched;
	Coll bar;
	Wg wg[2];
	Warp warp[8];
	std::function<void()> body;
	unsigned long progress;
	const char *fault;
};

Block *B;
size_t smem_bytes;

int tid()
{
	return B->cur;
}

void yield()
{
	swapcontext(&B->f[B->cur].ctx, &B->sched);
}

// the last of @need arrivals runs @act, then every one goes on
template <class F> void collective(Coll &c, int need, F act)
{
	const unsigned g = c.gen;

	if (++c.count == need) {
		act();
		c.count = 0;
		c.gen++;
		B->progress++;
		return;
	}
	while (c.gen == g)
		yield();
}

void fiber_main()
{
	B->body();
	B->f[B->cur].done = true;
	B->progress++;
	swapcontext(&B->f[B->cur].ctx, &B->sched);
}

float bfv(const void *p)
{
	return __bfloat162float(*(const bf16 *)p);
}

// an operand element (mn, k) of a descriptor's tile: K-major (t 0) or MN-major (t 1)
float ld_desc(uint64_t desc, int t, int mn, int k)
{
	const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
	const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
	const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
	uint32_t a;

	if ((desc >> 62) != 1)
		emu_trap("descriptor without the 128-byte swizzle", 0);
	a = t == 0 ? start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2 :
		     start + (k / 8) * sbo + (k % 8) * 128 + (mn / 64) * lbo + (mn % 64) * 2;
	a ^= ((a >> 7) & 7) << 4;
	if (a + 2 > smem_bytes)
		emu_trap("wgmma operand past the block's shared memory", 0);
	return bfv((const char *)fa_sm + a);
}

float as_float(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float lo16(uint32_t v)
{
	return as_float(v << 16);
}

float hi16(uint32_t v)
{
	return as_float(v & 0xFFFF0000u);
}

// one wgmma of the warpgroup, all 128 threads' parts
void exec(const WgOp &op)
{
	static float A[64][16], Bm[16][256];

	for (int m = 0; m < 64; m++)
		for (int k = 0; k < 16; k++)
			A[m][k] = op.rs ? 0.f : ld_desc(op.ad, op.ta, m, k);
	if (op.rs)
		for (int i = 0; i < 128; i++) {
			const int w = i / 32, g = (i % 32) / 4, t = i % 4;

			for (int r = 0; r < 4; r++) {
				const int m = 16 * w + g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);

				A[m][k] = lo16(op.a[i][r]);
				A[m][k + 1] = hi16(op.a[i][r]);
			}
		}
	for (int k = 0; k < 16; k++)
		for (int n = 0; n < op.n; n++)
			Bm[k][n] = ld_desc(op.bd, op.tb, n, k);
	for (int i = 0; i < 128; i++) {
		const int w = i / 32, g = (i % 32) / 4, t = i % 4;

		for (int n8 = 0; n8 < op.n / 8; n8++)
			for (int e = 0; e < 4; e++) {
				const int m = 16 * w + g + 8 * (e >> 1), n = 8 * n8 + 2 * t + (e & 1);
				float s = 0.f, &d = op.d[i][4 * n8 + e];

				for (int k = 0; k < 16; k++)
					s += A[m][k] * Bm[k][n];
				d = op.acc ? d + s : s;
			}
	}
}

void run_copies(std::vector<Copy> &v)
{
	for (const Copy &c : v) {
		if (c.dst + c.bytes > smem_bytes)
			emu_trap("cp.async past the block's shared memory", 0);
		if (c.valid)
			memcpy((char *)fa_sm + c.dst, c.src, c.bytes);
		else
			memset((char *)fa_sm + c.dst, 0, c.bytes);
	}
	v.clear();
}

} // namespace

void emu_syncthreads(void)
{
	collective(B->bar, B->nthr, [] {});
}

void emu_trap(const char *file, int line)
{
	fprintf(stderr, "emu: trap: %s:%d (thread %d)\n", file, line, B ? B->cur : -1);
	abort();
}

uint32_t emu_shfl_xor32(uint32_t v, int m)
{
	Warp &w = B->warp[tid() / 32];
	const int lane = tid() % 32;
	uint32_t r;

	w.slot[lane] = v;
	collective(w.c, 32, [] {});
	r = w.slot[lane ^ m];
	collective(w.c, 32, [] {});	// every lane read before the slots are reused
	return r;
}

uint32_t emu_smem_u32(const void *p)
{
	return (uint32_t)((const char *)p - (const char *)fa_sm);
}

void emu_cp_async(uint32_t dst, const void *src, int bytes, bool valid)
{
	B->f[tid()].open.push_back({ dst, src, bytes, valid });
}

void emu_cp_commit(void)
{
	Fiber &f = B->f[tid()];

	f.groups.push_back(std::move(f.open));
	f.open.clear();
}

void emu_cp_wait(int n)
{
	Fiber &f = B->f[tid()];

	if (n < 0) {
		emu_cp_commit();
		n = 0;
	}
	while ((int)f.groups.size() > n) {
		run_copies(f.groups.front());
		f.groups.pop_front();
	}
}

void emu_wgmma(int n, float *d, const uint32_t *a, uint64_t ad, uint64_t bd, int acc, int ta,
	       int tb)
{
	Wg &g = B->wg[tid() / 128];
	WgOp &o = g.building;
	const int i = tid() % 128;

	if (g.c.count == 0) {
		o.n = n, o.acc = acc, o.ta = ta, o.tb = tb, o.rs = a != nullptr, o.ad = ad,
		o.bd = bd;
	} else if (o.n != n || o.acc != acc || o.ta != ta || o.tb != tb || o.rs != (a != nullptr) ||
		   o.ad != ad || o.bd != bd) {
		emu_trap("the warpgroup's threads issued different wgmma", 0);
	}
	o.d[i] = d;
	if (a)
		memcpy(o.a[i], a, sizeof(o.a[i]));
	collective(g.c, 128, [&g] { g.open.push_back(g.building); });
}

void emu_wg_commit(void)
{
	Wg &g = B->wg[tid() / 128];

	collective(g.c, 128, [&g] {
		g.groups.push_back(std::move(g.open));
		g.open.clear();
	});
}

void emu_wg_wait(int n)
{
	Wg &g = B->wg[tid() / 128];

	collective(g.c, 128, [&g, n] {
		while ((int)g.groups.size() > n) {
			for (const WgOp &op : g.groups.front())
				exec(op);
			g.groups.pop_front();
		}
	});
}

void emu_red_add(float *p, float x)
{
	*p += x;
}

bool emu_any(bool pred)
{
	Warp &w = B->warp[tid() / 32];
	const int lane = tid() % 32;
	bool r = false;

	w.slot[lane] = pred;
	collective(w.c, 32, [] {});
	for (int i = 0; i < 32; i++)
		r |= w.slot[i] != 0;
	collective(w.c, 32, [] {});
	return r;
}

void emu_syncwarp(void)
{
	collective(B->warp[tid() / 32].c, 32, [] {});
}

namespace {

struct D3 {
	unsigned x, y, z;
};

// every block of the grid, one after another, each on nthr fibers
void launch(D3 grid, int nthr, size_t smem, const std::function<void()> &body)
{
	if (smem > sizeof(fa_sm) || nthr > 256 || nthr % 32) {
		fprintf(stderr, "emu: launch of %d threads, %zu bytes of shared memory\n", nthr, smem);
		abort();
	}
	smem_bytes = smem;
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				Block blk;
				int ndone = 0;

				blk.nthr = nthr;
				blk.body = body;
				blk.progress = 0;
				blk.f.resize(nthr);
				B = &blk;
				/* a large finite value: read where nothing wrote, it shows */
				for (size_t i = 0; i < sizeof(fa_sm) / sizeof(bf16); i++)
					fa_sm[i] = __float2bfloat16_rn(60000.f);
				for (int t = 0; t < nthr; t++) {
					Fiber &f = blk.f[t];

					f.done = false;
					f.now = { { (unsigned)t, 0, 0 }, { x, y, z },
						  { grid.x, grid.y, grid.z }, { (unsigned)nthr, 1, 1 } };
					f.stack.resize(1 << 18);
					getcontext(&f.ctx);
					f.ctx.uc_stack.ss_sp = f.stack.data();
					f.ctx.uc_stack.ss_size = f.stack.size();
					f.ctx.uc_link = nullptr;
					makecontext(&f.ctx, fiber_main, 0);
				}
				while (ndone < nthr) {
					const unsigned long p0 = blk.progress;

					for (int t = 0; t < nthr; t++) {
						if (blk.f[t].done)
							continue;
						blk.cur = t;
						emu_now = &blk.f[t].now;
						swapcontext(&blk.sched, &blk.f[t].ctx);
					}
					ndone = 0;
					for (int t = 0; t < nthr; t++)
						ndone += blk.f[t].done;
					if (ndone < nthr && blk.progress == p0) {
						fprintf(stderr, "emu: block (%u,%u,%u): deadlock (%d of %d "
							"threads done)\n", x, y, z, ndone, nthr);
						abort();
					}
				}
				for (int w = 0; w < 2; w++)
					if (!blk.wg[w].open.empty() || !blk.wg[w].groups.empty()) {
						fprintf(stderr, "emu: a block ended with wgmma not waited for\n");
						abort();
					}
				B = nullptr;
			}
}

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

template <int HD> void fused_bwd(const Prob &p, bf16 *dq, const bf16 *dout, const float *ls,
				 const float *Dp, const bf16 *qkv, const int *lens, const int *pos);

// the backward: dq kernel + dk/dv kernel (pipe or not), or the fused dq; dqkv (bf16)
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
	if (how < 2) {
		const bool pipe = how == 1;

		launch({ (unsigned)((L + C::BMQ - 1) / C::BMQ), (unsigned)nh, (unsigned)B_ }, C::NT,
		       fa_smem_dq<HD, true>(), [=] {
			       k_fa_dq<HD, false, true>(dq, dout, ls, Dp, qkv, lens, pos, L, nh,
							nkv, sl2, scale, fa_rows{});
		       });
		launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
		       fa_smem_dkdv<HD, true>(), [=] {
			       k_fa_dkdv<HD, false, true>(dq, nullptr, dout, ls, Dp, qkv, lens,
							  pos, L, nh, nkv, sl2, scale,
							  fa_rows{}, pipe, nullptr, 0);
		       });
		return;
	}
	if constexpr (HD <= 128)	// (the fused dq is for head_dim 64 and 128)
		fused_bwd<HD>(p, dq, dout, ls, Dp, qkv, lens, pos);
}

// the fused dq: sums (B nh HD, Lp) zeroed, then k_fa_dq_out's transpose and scale here
template <int HD> void fused_bwd(const Prob &p, bf16 *dq, const bf16 *dout, const float *ls,
				 const float *Dp, const bf16 *qkv, const int *lens, const int *pos)
{
	using C = fa_cfg<HD, true>;
	const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
	const float scale = (float)(1.0 / sqrt((double)HD));
	const int L = p.L, nh = p.nh, nkv = p.nkv, B_ = p.B;
	const int Lp = fa_dq_pitch(L);
	std::vector<float> dqa((size_t)B_ * nh * HD * Lp, 0.f);
	float *a = dqa.data();

	launch({ (unsigned)((L + FA_BM - 1) / FA_BM), (unsigned)nkv, (unsigned)B_ }, C::KNT,
	       fa_smem_dkdv<HD, true, true>(), [=] {
		       k_fa_dkdv<HD, false, true, true>(dq, nullptr, dout, ls, Dp, qkv, lens,
							pos, L, nh, nkv, sl2, scale, fa_rows{},
							true, a, Lp);
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
	std::vector<bf16> out((size_t)B_ * L * nh * HD), dqkv;
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
	for (int how = 0; how < (HD <= 128 ? 3 : 2); how++) {
		static const char *name[] = { "backward (dq, dk/dv unpipelined): dqkv",
					      "backward (dq, dk/dv pipelined): dqkv",
					      "backward (fused dq): dqkv" };

		run_bwd<HD>(p, how, out, lse, dqkv, ln);
		mask_pad(p, dqkv, p.W());
		compare(name[how], p, dqkv.data(), p.dq, 3e-2);
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
