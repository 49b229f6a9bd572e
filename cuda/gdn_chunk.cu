// gdn_chunk.cu: the gated delta rule in its chunked form (issue 12), the same ops as gdn.cu's
// recurrence (sl_cuda_gdn_rule_fwd / _bwd; backend_cuda_gdn.c picks one by SHARDLM_GDN_KERNEL).
// The algorithm is written out on the host in test/gdn_chunk_ref.h (its comment has the
// formulas), where test_gdn_chunk holds it to the cpu recurrence; these kernels transcribe it.
//
// Per chunk of GC = 64 positions the local quantities (cumulated decays, the 64 x 64 products
// k.k and q.k, T = (I + A)^-1) are made in shared memory; only the pass over a record's chunks is
// sequential:
//   k_gdn_fwd          block (record, value head): the dk x dv state walks the chunks, o and
//                      the chunk-start states out;
//   k_gdn_bwd_state    block (record, value head): dS walks the chunks backwards, dS at every
//                      chunk's end into scratch;
//   k_gdn_bwd_grad     block (record, key head, chunk): every gradient of the chunk from its
//                      saved start state and that dS, the value heads of the key head in order
//                      (dq, dk summed in fp32 in the scratch in a fixed order: deterministic).
// The split forms (the defaults) make the chunk-local quantities for every chunk at once first
// (k_gdn_prep), so that the sequential pass has two or three products a chunk (k_gdn_walk_fwd,
// k_gdn_walk_bwd: the state in registers, gdn_walk.cuh; k_gdn_fwd_h, k_gdn_bwd_h: in shared
// memory); the forward's register walk makes each chunk's output on the way (split 3, the
// default), else a third pass makes it for every chunk at once (k_gdn_fwd_o).  With the state
// in registers (split 2, 3) and dv <= dk the backward's gradients run in three kernels
// (gdn_grad.cuh): k_gdn_grad_v, the sums over the value columns in registers; k_gdn_bwd_grad,
// the GC x GC part (dbeta, dg, and the matrices M, D + D^T); k_gdn_grad_k, dq and dk through
// those in registers.
// Every product runs on the tensor cores (tc_mm.cuh: tf32 operands, fp32 sums and states).  The
// backward grows the scratch to hold every (record, key head) group's dS and dq, dk once, where
// the device has room; else it runs in waves of groups that fit.
#include <cmath>

#include "common.cuh"
#include "gdn_chunk.cuh"
#include "gdn_walk.cuh"
#include "gdn_grad.cuh"

// ---- launchers ------------------------------------------------------------------------------

#define SMEM_MAX (227 * 1024)
#define SCRATCH_GROW_MAX ((size_t)4 << 30)	// the backward's scratch beyond this: waves

// whether the chunked kernels take this shape (else the caller keeps the recurrence): the
// shared memory, and the scratch holding one (record, key head) group's share of the backward,
// grown to it here where it is short (long records; once)
extern "C" int sl_cuda_gdn_chunk_fits(struct sl_cuda *c, int dk, int dv, int L, int nk, int nv)
{
	size_t per_group = bwd_scratch_floats(1, nv / nk, (L + GC - 1) / GC, dk, dv) *
			   sizeof(float);

	if (!(dk <= DKMAX && dv > 0 && dv <= DVMAX && gq_smem(dk) <= SMEM_MAX &&
	      state_smem(dk, dv) <= SMEM_MAX && fwd_smem(dk, dv) <= SMEM_MAX &&
	      prep_smem(dk, dv) <= SMEM_MAX && fwd_h_smem(dk, dv) <= SMEM_MAX &&
	      fwd_o_smem(dk, dv) <= SMEM_MAX && bwd_h_smem(dk, dv) <= SMEM_MAX))
		return 0;
	return per_group <= c->scratch_bytes ||
	       (per_group <= SCRATCH_GROW_MAX && sl_cuda_scratch_grow(c, per_group) == 0);
}

extern "C" size_t sl_cuda_gdn_chunk_aux(size_t chunks, int nv, int dv)
{
	return aux_floats(chunks, nv, dv);
}

extern "C" void sl_cuda_gdn_chunk_fwd(struct sl_cuda *c, void *o, float *states, float *aux,
				      const void *qn,
				      const void *kn, const void *v, int vs, const float *beta,
				      const float *g, const int *lens, int B, int L, int nk,
				      int nv, int dk, int dv, int split)
{
	int nch = (L + GC - 1) / GC, blocks = B * nv * nch;
	size_t smem = fwd_smem(dk, dv);
	size_t need = (size_t)blocks * fslot_floats(dk, dv, 0) * sizeof(float);

	// three passes where every chunk's slot fits the scratch (grown once, as the backward's)
	if (split && need <= SCRATCH_GROW_MAX)
		sl_cuda_scratch_grow(c, need);	// -1: the old one kept, too small
	if (split && need <= c->scratch_bytes) {
		float *scr = sl_cuda_scratch(c, need, "chunked gated delta rule forward");
		size_t ps = prep_smem(dk, dv), os = fwd_o_smem(dk, dv);

		CUDA_CHECK(cudaFuncSetAttribute(k_gdn_prep,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)ps));
		CUDA_CHECK(cudaFuncSetAttribute(k_gdn_fwd_o,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)os));
		k_gdn_prep<<<blocks, NTH, ps, c->stream>>>(scr, (const bf16 *)qn, (const bf16 *)kn,
							   (const bf16 *)v, vs, NULL, beta, g, lens,
							   L, nk, nv, dk, dv, 0);
		CUDA_LAUNCHED();
		if (split >= 2 && walk_fits(dk, dv)) {	// the state in registers
			bool fo = split == 3;	// the walk makes the output too
			size_t ws = walk_fwd_smem(dk, fo);

			CUDA_CHECK(cudaFuncSetAttribute(k_gdn_walk_fwd,
							cudaFuncAttributeMaxDynamicSharedMemorySize,
							(int)ws));
			k_gdn_walk_fwd<<<B * nv, NTH, ws, c->stream>>>(
				fo ? (bf16 *)o : NULL, states, scr, aux, (const bf16 *)qn,
				(const bf16 *)kn, lens, L, nk, nv, dk, dv);
			CUDA_LAUNCHED();
			if (fo)
				return;
		} else {
			size_t hs = fwd_h_smem(dk, dv);

			CUDA_CHECK(cudaFuncSetAttribute(k_gdn_fwd_h,
							cudaFuncAttributeMaxDynamicSharedMemorySize,
							(int)hs));
			k_gdn_fwd_h<<<B * nv, NTH, hs, c->stream>>>(states, scr, aux,
								    (const bf16 *)kn, lens, L, nk,
								    nv, dk, dv);
		}
		CUDA_LAUNCHED();
		k_gdn_fwd_o<<<blocks, NTH, os, c->stream>>>((bf16 *)o, states, scr, aux,
							    (const bf16 *)qn, lens, L, nk, nv, dk,
							    dv);
		CUDA_LAUNCHED();
		return;
	}
	CUDA_CHECK(cudaFuncSetAttribute(k_gdn_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
	k_gdn_fwd<<<B * nv, NTH, smem, c->stream>>>((bf16 *)o, states, aux, (const bf16 *)qn,
						    (const bf16 *)kn, (const bf16 *)v, vs, beta, g,
						    lens, L, nk, nv, dk, dv);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gdn_chunk_bwd(struct sl_cuda *c, void *dqn, void *dkn, void *dval,
				      void *dbeta, void *dg, const void *dout, const float *states,
				      const float *aux, const void *qn, const void *kn,
				      const void *v, int vs, const float *beta, const float *g,
				      const int *lens, int B, int L, int nk, int nv, int dk, int dv,
				      int split)
{
	int grp = nv / nk, nch = (L + GC - 1) / GC;
	size_t per_group = bwd_scratch_floats(1, grp, nch, dk, dv) * sizeof(float);
	size_t ss = state_smem(dk, dv), gs = gq_smem(dk), ps = prep_smem(dk, dv);
	size_t hs = bwd_h_smem(dk, dv);
	const bool reg = split >= 2 && walk_fits(dk, dv);	// the state walked in registers
	// the sums over the value columns in registers (where the forward left its tiles)
	const bool gvr = split >= 2 && aux && grad_fits(dk, dv);
	int per_wave;
	float *dst;

	// every group at once where the device has room (one wave: all heads in parallel)
	if (per_group * B * nk <= SCRATCH_GROW_MAX)
		sl_cuda_scratch_grow(c, per_group * B * nk);
	per_wave = (int)(c->scratch_bytes / per_group);
	if (per_wave > B * nk)
		per_wave = B * nk;
	dst = sl_cuda_scratch(c, (size_t)per_wave * per_group, "chunked gated delta rule backward");
	CUDA_CHECK(cudaFuncSetAttribute(k_gdn_bwd_state,
					cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ss));
	CUDA_CHECK(cudaFuncSetAttribute(k_gdn_prep, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)ps));
	CUDA_CHECK(cudaFuncSetAttribute(k_gdn_bwd_h, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)hs));
	if (reg)
		CUDA_CHECK(cudaFuncSetAttribute(k_gdn_walk_bwd,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)walk_bwd_smem(dk, dv)));
	CUDA_CHECK(cudaFuncSetAttribute(k_gdn_bwd_grad,
					cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gs));
	if (gvr) {
		CUDA_CHECK(cudaFuncSetAttribute(k_gdn_grad_v,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)grad_v_smem()));
		CUDA_CHECK(cudaFuncSetAttribute(k_gdn_grad_k,
						cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)grad_k_smem()));
	}
	for (int first = 0; first < B * nk; first += per_wave) {
		int ng = B * nk - first < per_wave ? B * nk - first : per_wave;
		float *slots = dst + bwd_slots(per_wave, grp, nch, dk, dv);
		float *acc = dst + (size_t)per_wave * grp * nch * dk * dv;
		float *gv = dst + bwd_gv(per_wave, grp, nch, dk, dv);

		if (split) {	// every chunk's W, X, P, G, then the walk: three products a chunk
			k_gdn_prep<<<ng * grp * nch, NTH, ps, c->stream>>>(
				slots, (const bf16 *)qn, (const bf16 *)kn, (const bf16 *)v, vs,
				(const bf16 *)dout, beta, g, lens, L, nk, nv, dk, dv, first * grp);
			CUDA_LAUNCHED();
			if (reg)
				k_gdn_walk_bwd<<<ng * grp, NTH, walk_bwd_smem(dk, dv), c->stream>>>(
					dst, slots, (const bf16 *)dout, (const bf16 *)qn,
					(const bf16 *)kn, gvr ? aux : NULL, lens, L, nk, nv, dk, dv,
					first);
			else
				k_gdn_bwd_h<<<ng * grp, NTH, hs, c->stream>>>(
					dst, slots, (const bf16 *)dout, (const bf16 *)qn,
					(const bf16 *)kn, lens, L, nk, nv, dk, dv, first);
		} else {
			k_gdn_bwd_state<<<ng * grp, NTH, ss, c->stream>>>(
				dst, (const bf16 *)dout, (const bf16 *)qn, (const bf16 *)kn, beta,
				g, lens, L, nk, nv, dk, dv, first);
		}
		CUDA_LAUNCHED();
		if (gvr) {
			k_gdn_grad_v<<<ng * nch * 2, NTH, grad_v_smem(), c->stream>>>(
				gv, acc, (bf16 *)dval, dst, slots, states, aux, (const bf16 *)qn,
				(const bf16 *)kn, (const bf16 *)dout, (const bf16 *)v, vs, beta, lens,
				L, nk, nv, dk, dv, first);
			CUDA_LAUNCHED();
		}
		k_gdn_bwd_grad<<<ng * nch, NTH, gs, c->stream>>>(
			(bf16 *)dqn, (bf16 *)dkn, (bf16 *)dval, (bf16 *)dbeta, (bf16 *)dg,
			(const bf16 *)dout, states, aux, dst, acc, split ? slots : NULL,
			(const bf16 *)qn, (const bf16 *)kn, (const bf16 *)v, vs, beta, g, lens, L,
			nk, nv, dk, dv, first, gvr ? gv : NULL);
		CUDA_LAUNCHED();
		if (gvr) {
			k_gdn_grad_k<<<ng * nch * 2, NTH, grad_k_smem(), c->stream>>>(
				(bf16 *)dqn, (bf16 *)dkn, gv, acc, slots, aux, (const bf16 *)qn,
				(const bf16 *)kn, beta, lens, L, nk, nv, dk, dv, first);
			CUDA_LAUNCHED();
		}
	}
}

// ---- tc_mm on its own (test_cuda_qwen35 holds its fragment layouts to a host product) ---------

__global__ void __launch_bounds__(NTH) k_tc_mm_test(int M, int N, int K, const void *A, int ars,
						    int acs, int abf, const void *B, int brs,
						    int bcs, int bbf, const float *sk,
						    const float *rs, float alpha, float cb,
						    float *C, int crs, int ccs, int sh)
{
	extern __shared__ float sm[];
	size_t na = (size_t)M * K * (abf ? 2 : 4), nb = (size_t)K * N * (bbf ? 2 : 4);
	unsigned char *s = (unsigned char *)sm;

	if (sh) {	// A (sh 1), or A and B (sh 2), copied into shared memory first
		for (size_t x = threadIdx.x; x < na; x += NTH)
			s[x] = ((const unsigned char *)A)[x];
		A = s;
		if (sh == 2) {
			s += (na + 15) & ~(size_t)15;
			for (size_t x = threadIdx.x; x < nb; x += NTH)
				s[x] = ((const unsigned char *)B)[x];
			B = s;
		}
		__syncthreads();
	}
	struct mmop a = abf ? mm_b((const bf16 *)A, ars, acs) : mm_f((const float *)A, ars, acs);
	struct mmop b = bbf ? mm_b((const bf16 *)B, brs, bcs) : mm_f((const float *)B, brs, bcs);

	tc_mm(M, N, K, a, b, sk, rs, alpha, cb, C, crs, ccs);
}

extern "C" void sl_cuda_tc_mm_test(struct sl_cuda *c, int M, int N, int K, const void *A,
				   int ars, int acs, int abf, const void *B, int brs, int bcs,
				   int bbf, const float *sk, const float *rs, float alpha, float cb,
				   float *C, int crs, int ccs, int sh)
{
	size_t smem = sh ? (((size_t)M * K * (abf ? 2 : 4) + 15) & ~(size_t)15) +
				   (sh == 2 ? (size_t)K * N * (bbf ? 2 : 4) : 0) : 0;

	CUDA_CHECK(cudaFuncSetAttribute(k_tc_mm_test, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
	k_tc_mm_test<<<1, NTH, smem, c->stream>>>(M, N, K, A, ars, acs, abf, B, brs, bcs, bbf, sk,
						  rs, alpha, cb, C, crs, ccs, sh);
	CUDA_LAUNCHED();
}
