// gdn_chunk.cu: the gated delta rule in its chunked form (issue 12), the same ops as gdn.cu's
// recurrence (sl_cuda_gdn_rule_fwd / _bwd; backend_cuda_gdn.c picks one by SHARDLM_GDN_KERNEL).
// The algorithm is written out on the host in test/gdn_chunk_ref.h (its comment has the
// formulas), where test_gdn_chunk holds it to the cpu recurrence; these kernels transcribe it.
//
// Per chunk of GC = 64 positions the local quantities (cumulated decays, the 64 x 64 products
// k.k and q.k, T = (I + A)^-1 by forward substitution) are made in shared memory by every block
// that needs them; only the pass over a record's chunks is sequential:
//   k_chunk_fwd        block (record, value head, tile of VF value columns): the state tile walks
//                      the chunks, o and the chunk-start states out;
//   k_chunk_bwd_state  block (record, value head, tile of VF columns): dS walks the chunks
//                      backwards, dS at every chunk's end into scratch;
//   k_chunk_bwd_grad   block (record, key head, chunk): every gradient of the chunk from its
//                      saved start state and that dS, the value heads of the key head in order
//                      (dq, dk summed in registers in a fixed order: deterministic).
// The backward runs in waves of (record, key head) groups whose dS fit the scratch.  fp32
// arithmetic and states, bf16 k and q in shared memory (they are bf16 inputs: exact).  Plain
// FMA loops over shared memory: the tensor-core tiling is still to come.
#include <cmath>

#include "common.cuh"
#include "gdn_chunk.cuh"

// ---- launchers ------------------------------------------------------------------------------

#define SMEM_MAX (227 * 1024)

// whether the chunked kernels take this shape (else the caller keeps the recurrence)
extern "C" int sl_cuda_gdn_chunk_fits(struct sl_cuda *c, int dk, int dv, int L, int nk, int nv)
{
	size_t per_group = (size_t)(nv / nk) * ((L + GC - 1) / GC) * dk * dv * sizeof(float);

	return dk <= DKMAX && dv > 0 && grad_smem(dk) <= SMEM_MAX && state_smem(dk) <= SMEM_MAX &&
	       fwd_smem(dk) <= SMEM_MAX && per_group <= c->scratch_bytes;
}

extern "C" void sl_cuda_gdn_chunk_fwd(struct sl_cuda *c, void *o, float *states, const void *qn,
				      const void *kn, const void *v, int vs, const float *beta,
				      const float *g, const int *lens, int B, int L, int nk,
				      int nv, int dk, int dv)
{
	size_t smem = fwd_smem(dk);
	int ntile = (dv + VF - 1) / VF;

	CUDA_CHECK(cudaFuncSetAttribute(k_chunk_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
	k_chunk_fwd<<<B * nv * ntile, NTH, smem, c->stream>>>(
		(bf16 *)o, states, (const bf16 *)qn, (const bf16 *)kn, (const bf16 *)v, vs, beta, g,
		lens, L, nk, nv, dk, dv, ntile);
	CUDA_LAUNCHED();
}

extern "C" void sl_cuda_gdn_chunk_bwd(struct sl_cuda *c, void *dqn, void *dkn, void *dval,
				      void *dbeta, void *dg, const void *dout, const float *states,
				      const void *qn, const void *kn, const void *v, int vs,
				      const float *beta, const float *g, const int *lens, int B,
				      int L, int nk, int nv, int dk, int dv)
{
	int grp = nv / nk, nch = (L + GC - 1) / GC, ntile = (dv + VF - 1) / VF;
	size_t per_group = (size_t)grp * nch * dk * dv * sizeof(float);
	size_t ss = state_smem(dk), gs = grad_smem(dk);
	int per_wave = (int)(c->scratch_bytes / per_group);
	float *dst;

	if (per_wave > B * nk)
		per_wave = B * nk;
	dst = sl_cuda_scratch(c, (size_t)per_wave * per_group, "chunked gated delta rule backward");
	CUDA_CHECK(cudaFuncSetAttribute(k_chunk_bwd_state,
					cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ss));
	CUDA_CHECK(cudaFuncSetAttribute(k_chunk_bwd_grad,
					cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gs));
	for (int first = 0; first < B * nk; first += per_wave) {
		int ng = B * nk - first < per_wave ? B * nk - first : per_wave;

		k_chunk_bwd_state<<<ng * grp * ntile, NTH, ss, c->stream>>>(
			dst, (const bf16 *)dout, (const bf16 *)qn, (const bf16 *)kn, beta, g, lens,
			L, nk, nv, dk, dv, ntile, first);
		CUDA_LAUNCHED();
		k_chunk_bwd_grad<<<ng * nch, NTH, gs, c->stream>>>(
			(bf16 *)dqn, (bf16 *)dkn, (bf16 *)dval, (bf16 *)dbeta, (bf16 *)dg,
			(const bf16 *)dout, states, dst, (const bf16 *)qn, (const bf16 *)kn,
			(const bf16 *)v, vs, beta, g, lens, L, nk, nv, dk, dv, first);
		CUDA_LAUNCHED();
	}
}
