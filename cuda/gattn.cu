// gattn.cu: the Qwen3.5 gated full-attention layer's kernels (issue 12) with their extern "C"
// launchers: the q/k RMSNorm with partial rotary embedding on the fused q|gate, k, v projection,
// and the sigmoid output gate.  bf16 in memory, fp32 arithmetic, fixed-order reductions.
#include <cmath>

#include "common.cuh"
#include "norm_dw.cuh"

#define NT 256

static int round32(int n)
{
	return (n + 31) / 32 * 32;
}

#define GRID_LOOP(i, n)                                                                     \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);             \
	     i += (size_t)gridDim.x * blockDim.x)

// ---- gated attention: q/k norm, partial rotary, output gate -------------------------------------

static __device__ __forceinline__ size_t gq_in_off(int t, int j, int nh, int hd, int Win)
{
	return (size_t)t * Win + (j < nh ? (size_t)j * 2 * hd : (size_t)(2 * nh + j - nh) * hd);
}

// block (token, q or k head), thread i < hd: element i
__global__ void k_gattn_fwd(bf16 *out, bf16 *gate, float *rstd, const bf16 *in, const bf16 *qw,
			    const bf16 *kw, const float *cs, int L, const int *pos, int nh,
			    int nkv, int hd, int rot, float eps)
{
	extern __shared__ float n[];
	int nq = nh + nkv, t = blockIdx.x / nq, j = blockIdx.x % nq, i = threadIdx.x;
	int Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd, half = rot / 2;
	const bf16 *x = in + gq_in_off(t, j, nh, hd, Win), *w = j < nh ? qw : kw;
	const float *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;
	float xi = i < hd ? bf(x[i]) : 0.f, r = rsqrtf(block_sum(xi * xi) / hd + eps), y;

	if (i < hd)
		n[i] = xi * r * bf(w[i]);
	if (!i)
		rstd[(size_t)t * nq + j] = r;
	__syncthreads();
	if (i >= hd)
		return;
	if (i < half)
		y = n[i] * c[i] - n[i + half] * s[i];
	else if (i < rot)
		y = n[i] * c[i - half] + n[i - half] * s[i - half];
	else
		y = n[i];
	out[(size_t)t * Wout + (size_t)j * hd + i] = tobf(y);
	if (j < nh)
		gate[(size_t)t * nh * hd + (size_t)j * hd + i] = x[hd + i];
}

// v heads copied between the two layouts (forward: in -> out; backward: out -> in)
__global__ void k_gattn_v(bf16 *dst, const bf16 *src, int T, int nh, int nkv, int hd, int fwd)
{
	int Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd;

	GRID_LOOP(k, (size_t)T * nkv * hd)
	{
		size_t t = k / ((size_t)nkv * hd), e = k % ((size_t)nkv * hd);
		size_t io = t * Win + (size_t)(2 * nh + nkv) * hd + e;
		size_t oo = t * Wout + (size_t)(nh + nkv) * hd + e;

		if (fwd)
			dst[oo] = src[io];
		else
			dst[io] = src[oo];
	}
}

static __device__ __forceinline__ float prope_back(const bf16 *dy, const float *c, const float *s,
						   int i, int half, int rot)
{
	if (i >= rot)
		return bf(dy[i]);
	if (i < half)
		return bf(dy[i]) * c[i] + bf(dy[i + half]) * s[i];
	i -= half;
	return -bf(dy[i]) * s[i] + bf(dy[i + half]) * c[i];
}

__global__ void k_gattn_bwd(bf16 *din, const bf16 *dout, const bf16 *dgate, const bf16 *in,
			    const bf16 *qw, const bf16 *kw, const float *rstd, const float *cs,
			    int L, const int *pos, int nh, int nkv, int hd, int rot)
{
	int nq = nh + nkv, t = blockIdx.x / nq, j = blockIdx.x % nq, i = threadIdx.x;
	int Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd, half = rot / 2;
	size_t io = gq_in_off(t, j, nh, hd, Win);
	const bf16 *x = in + io, *w = j < nh ? qw : kw;
	const bf16 *dy = dout + (size_t)t * Wout + (size_t)j * hd;
	const float *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;
	float r = rstd[(size_t)t * nq + j], dn = 0.f, sum;

	if (i < hd)
		dn = prope_back(dy, c, s, i, half, rot);
	sum = block_sum(i < hd ? dn * bf(w[i]) * bf(x[i]) : 0.f);
	if (i >= hd)
		return;
	din[io + i] = tobf(r * bf(w[i]) * dn - bf(x[i]) * sum * r * r * r / hd);
	if (j < nh)
		din[io + hd + i] = dgate[(size_t)t * nh * hd + (size_t)j * hd + i];
}

// the q and k norm weights' gradients in two passes, in a fixed order (no atomics): block (token
// chunk, q|k), thread (element i, token lane): partial sums over the chunk's tokens and the heads
// into part(2, nchunk, hd); then norm_dw_final (norm_dw.cuh) adds the chunks' partials in order
__global__ void k_gattn_dw_partial(float *part, const bf16 *dout, const bf16 *in,
				   const float *rstd, const float *cs, int T, int L, const int *pos,
				   int nh, int nkv, int hd, int rot, int tpc)
{
	extern __shared__ float red[];	// (R, hd)
	const int nq = nh + nkv, Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd;
	const int half = rot / 2, kind = blockIdx.y, i = threadIdx.x, R = blockDim.y;
	const int j0 = kind ? nh : 0, j1 = kind ? nq : nh;
	const int t0 = blockIdx.x * tpc, t1 = min(T, t0 + tpc);
	float acc = 0.f;

	for (int t = t0 + threadIdx.y; t < t1; t += R) {
		const float *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;

		for (int j = j0; j < j1; j++)
			acc += prope_back(dout + (size_t)t * Wout + (size_t)j * hd, c, s, i, half, rot) *
			       bf(in[gq_in_off(t, j, nh, hd, Win) + i]) * rstd[(size_t)t * nq + j];
	}
	red[threadIdx.y * hd + i] = acc;
	__syncthreads();
	if (!threadIdx.y) {
		for (int k = 1; k < R; k++)
			acc += red[k * hd + i];
		part[((size_t)kind * gridDim.x + blockIdx.x) * hd + i] = acc;
	}
}

extern "C" void sl_cuda_gattn_qk_fwd(struct sl_cuda *c, void *out, void *gate, float *rstd,
				     const void *qgkv, const void *qw, const void *kw, int T,
				     int L, const int *pos, int nh, int nkv, int hd, int rot,
				     float eps, float theta)
{
	float *cs = rope_table(c, L, rot, theta, "partial rotary table");
	int threads = round32(hd);

	if (threads > 1024) {
		fprintf(stderr, "cuda: gated attention head_dim %d is too large\n", hd);
		abort();
	}
	k_gattn_fwd<<<T * (nh + nkv), threads, hd * sizeof(float), c->stream>>>(
		(bf16 *)out, (bf16 *)gate, rstd, (const bf16 *)qgkv, (const bf16 *)qw,
		(const bf16 *)kw, cs, L, pos, nh, nkv, hd, rot, eps);
	CUDA_LAUNCHED();
	k_gattn_v<<<grid_for((size_t)T * nkv * hd, NT), NT, 0, c->stream>>>(
		(bf16 *)out, (const bf16 *)qgkv, T, nh, nkv, hd, 1);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gattn_qk_bwd(struct sl_cuda *c, void *dqgkv, void *dqw, void *dkw,
				     const void *dout, const void *dgate, const void *qgkv,
				     const void *qw, const void *kw, const float *rstd, int T,
				     int L, const int *pos, int nh, int nkv, int hd, int rot,
				     float eps, float theta)
{
	float *cs = rope_table(c, L, rot, theta, "partial rotary table");

	k_gattn_bwd<<<T * (nh + nkv), round32(hd), 0, c->stream>>>(
		(bf16 *)dqgkv, (const bf16 *)dout, (const bf16 *)dgate, (const bf16 *)qgkv,
		(const bf16 *)qw, (const bf16 *)kw, rstd, cs, L, pos, nh, nkv, hd, rot);
	CUDA_LAUNCHED();
	k_gattn_v<<<grid_for((size_t)T * nkv * hd, NT), NT, 0, c->stream>>>(
		(bf16 *)dqgkv, (const bf16 *)dout, T, nh, nkv, hd, 0);
	CUDA_LAUNCHED();
	// the partials after the rotary table in the scratch (256-byte aligned)
	const size_t cs_floats = ((size_t)L * rot + 63) / 64 * 64;
	const int R = 256 / hd > 0 ? 256 / hd : 1;
	int tpc = 8, nchunk = (T + tpc - 1) / tpc;

	if (nchunk > 1024) {
		tpc = (T + 1023) / 1024;
		nchunk = (T + tpc - 1) / tpc;
	}
	float *part = sl_cuda_scratch(c, (cs_floats + (size_t)2 * nchunk * hd) * sizeof(float),
				      "gated attention norm dw") + cs_floats;

	k_gattn_dw_partial<<<dim3(nchunk, 2), dim3(hd, R), (size_t)R * hd * sizeof(float),
			     c->stream>>>(part, (const bf16 *)dout, (const bf16 *)qgkv, rstd, cs, T,
					  L, pos, nh, nkv, hd, rot, tpc);
	CUDA_LAUNCHED();
	norm_dw_final(c, dqw, dkw, part, nchunk, hd);
}

// ---- the sigmoid output gate --------------------------------------------------------------------

__global__ void k_sigmul_fwd(bf16 *y, const bf16 *x, const bf16 *g, size_t n)
{
	GRID_LOOP(i, n)
	y[i] = tobf(bf(x[i]) * sigm(bf(g[i])));
}

__global__ void k_sigmul_bwd(bf16 *dx, bf16 *dg, const bf16 *dy, const bf16 *x, const bf16 *g,
			     size_t n)
{
	GRID_LOOP(i, n)
	{
		float s = sigm(bf(g[i])), d = bf(dy[i]);

		dx[i] = tobf(d * s);
		dg[i] = tobf(d * bf(x[i]) * s * (1.f - s));
	}
}

extern "C" void sl_cuda_sigmoid_mul_fwd(struct sl_cuda *c, void *y, const void *x,
					const void *gate, size_t n)
{
	if (!n)
		return;
	k_sigmul_fwd<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)y, (const bf16 *)x,
							    (const bf16 *)gate, n);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_sigmoid_mul_bwd(struct sl_cuda *c, void *dx, void *dgate, const void *dy,
					const void *x, const void *gate, size_t n)
{
	if (!n)
		return;
	k_sigmul_bwd<<<grid_for(n, NT), NT, 0, c->stream>>>((bf16 *)dx, (bf16 *)dgate,
							    (const bf16 *)dy, (const bf16 *)x,
							    (const bf16 *)gate, n);
	CUDA_LAUNCHED();
}
