/*
 * backend_cuda_gdn: the cuda backend's Qwen3.5 hybrid ops (issue 12) over cuda/gdn.cu.
 * Not compiled on its own: backend_cuda.c includes it (it uses that file's C() and P()).
 */

static void cuda_conv1d_silu_fwd(struct sl_backend *be, void *out, void *pre, const void *x,
				 int xs, const void *w, int T, int L, int Cc, int K,
				 const void *halo)
{
	sl_cuda_conv1d_silu_fwd(C(be), out, pre, x, xs, w, T, L, Cc, K, halo);
}

static void cuda_conv1d_silu_bwd(struct sl_backend *be, void *dx, int xs, void *dw,
				 const void *dout, const void *x, const void *pre, const void *w,
				 int T, int L, int Cc, int K, const void *halo, void *dhalo)
{
	sl_cuda_conv1d_silu_bwd(C(be), dx, xs, dw, dout, x, pre, w, T, L, Cc, K, halo, dhalo);
}

static void cuda_gdn_prep_fwd(struct sl_backend *be, void *qn, void *kn, void *rqk, void *beta,
			      void *g, const void *qkv, const void *ab, int abs, const void *A_log,
			      const void *dt_bias, int T, int nk, int nv, int dk, int dv)
{
	sl_cuda_gdn_prep_fwd(C(be), qn, kn, rqk, beta, g, qkv, ab, abs, A_log, dt_bias, T, nk, nv,
			     dk, dv);
}

static void cuda_gdn_prep_bwd(struct sl_backend *be, void *dqkv, void *dab, int abs,
			      void *dA_log, void *ddt_bias, const void *dqn, const void *dkn,
			      const void *dbeta, const void *dg, const void *qkv, const void *ab,
			      const void *rqk, const void *beta, const void *g, const void *A_log,
			      const void *dt_bias, int T, int nk, int nv, int dk, int dv)
{
	sl_cuda_gdn_prep_bwd(C(be), dqkv, dab, abs, dA_log, ddt_bias, dqn, dkn, dbeta, dg, qkv,
			     ab, rqk, beta, g, A_log, dt_bias, T, nk, nv, dk, dv);
}

static void cuda_gdn_rule_fwd(struct sl_backend *be, void *o, void *states, const void *qn,
			      const void *kn, const void *v, int vs, const void *beta,
			      const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			      int nv, int dk, int dv, const void *s0, void *s_end)
{
	sl_cuda_gdn_rule_fwd(C(be), o, states, qn, kn, v, vs, beta, g, lens, B, L, rs, nk, nv, dk,
			     dv, s0, s_end);
}

static void cuda_gdn_rule_bwd(struct sl_backend *be, void *dqn, void *dkn, void *dval,
			      void *dbeta, void *dg, const void *dout, const void *states,
			      const void *qn, const void *kn, const void *v, int vs,
			      const void *beta, const void *g, const int32_t *lens, int B, int L,
			      int rs, int nk, int nv, int dk, int dv, const void *ds_end, void *ds0)
{
	sl_cuda_gdn_rule_bwd(C(be), dqn, dkn, dval, dbeta, dg, dout, states, qn, kn, v, vs, beta,
			     g, lens, B, L, rs, nk, nv, dk, dv, ds_end, ds0);
}

/*
 * The chunked kernels (cuda/gdn_chunk.cu), chosen at the backend's creation by
 * SHARDLM_GDN_KERNEL=chunked (the default, also named chunked-3pass: the forward in passes
 * where the scratch holds them, else in one kernel; the backward's state pass in two),
 * chunked-1pass (the forward in one kernel, the backward's state pass in two), chunked-fused
 * (each in one kernel) or recurrent (gdn.cu's per-token walk); the passes over the chunks hold
 * the state in registers (cuda/gdn_walk.cuh) where the shape allows (key dim a multiple of 8),
 * the forward's making each chunk's output on the way (SHARDLM_GDN_WALK=registers-state: a
 * third pass makes it, k_gdn_fwd_o; SHARDLM_GDN_WALK=shared: the walks in shared memory, and
 * that third pass, and the backward's gradients in one kernel: with either register walk, where
 * the value dim is at most the key dim, they hold their sums in registers too,
 * cuda/gdn_grad.cuh).  The chunked forwards leave the backward every chunk's delta and diag(Ga) Q
 * S0 past the states (gdn_states_extra; the trainer clears it where the memory plan has no
 * room), and set the flag there that says so (the recurrence clears it).  On the H200 at the 4B
 * layer (2026-12-02): the default forward 0.92 ms (the walk making the output; by a third pass
 * 1.20, the walk in shared memory 1.40), the one-kernel forward 1.40; the two-pass backward
 * 3.33 ms (its walk in shared memory and its gradients in one kernel 5.11), one kernel's
 * 5.92.  A shape they do not take (key
 * dim over 128, a group's share of the backward's scratch over 4 GiB or the device's room), or
 * a chunk of rows with a start or end state (context parallel), runs the recurrence.
 */
/* the room past the states (rs = L) where the chunked forwards leave the backward every chunk's
 * delta and diag(Ga) Q S0 */
static size_t cuda_gdn_states_extra(struct sl_backend *be, size_t chunks, int nv, int dk,
				    int dv)
{
	(void)be, (void)dk;
	return sl_cuda_gdn_chunk_aux(chunks, nv, dv);
}

/* that room in states (B records of L, rs = L) */
static float *gdn_aux(const void *states, int B, int L, int nv, int dk, int dv)
{
	return (float *)states + (size_t)B * ((L + 63) / 64) * nv * dk * dv;
}

static void cuda_gdn_chunk_fwd(struct sl_backend *be, void *o, void *states, const void *qn,
			       const void *kn, const void *v, int vs, const void *beta,
			       const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			       int nv, int dk, int dv, const void *s0, void *s_end)
{
	/* the room past the states: the caller gives it while gdn_states_extra is set */
	float *aux = rs == L && be->gdn_states_extra ? gdn_aux(states, B, L, nv, dk, dv) : NULL;

	if (rs != L || s0 || s_end || !sl_cuda_gdn_chunk_fits(C(be), dk, dv, L, nk, nv)) {
		if (aux)	/* nothing left for a chunked backward */
			sl_cuda_memset0(C(be), aux, sizeof(int));
		cuda_gdn_rule_fwd(be, o, states, qn, kn, v, vs, beta, g, lens, B, L, rs, nk, nv,
				  dk, dv, s0, s_end);
		return;
	}
	sl_cuda_gdn_chunk_fwd(C(be), o, states, aux, qn, kn, v, vs, beta, g, lens, B, L, nk, nv,
			      dk, dv, P(be)->gdn_fwd_split);
}

static void cuda_gdn_chunk_bwd(struct sl_backend *be, void *dqn, void *dkn, void *dval,
			       void *dbeta, void *dg, const void *dout, const void *states,
			       const void *qn, const void *kn, const void *v, int vs,
			       const void *beta, const void *g, const int32_t *lens, int B, int L,
			       int rs, int nk, int nv, int dk, int dv, const void *ds_end, void *ds0)
{
	if (rs != L || ds_end || ds0 || !sl_cuda_gdn_chunk_fits(C(be), dk, dv, L, nk, nv)) {
		cuda_gdn_rule_bwd(be, dqn, dkn, dval, dbeta, dg, dout, states, qn, kn, v, vs, beta,
				  g, lens, B, L, rs, nk, nv, dk, dv, ds_end, ds0);
		return;
	}
	sl_cuda_gdn_chunk_bwd(C(be), dqn, dkn, dval, dbeta, dg, dout, states,
			      be->gdn_states_extra ? gdn_aux(states, B, L, nv, dk, dv) : NULL, qn,
			      kn, v, vs, beta, g, lens, B, L, nk, nv, dk, dv,
			      P(be)->gdn_bwd_split);
}

static void cuda_gated_rmsnorm_fwd(struct sl_backend *be, void *out, void *rstd, const void *x,
				   const void *z, int zs, const void *w, int T, int nh, int d,
				   float eps)
{
	sl_cuda_gated_rmsnorm_fwd(C(be), out, rstd, x, z, zs, w, T, nh, d, eps);
}

static void cuda_gated_rmsnorm_bwd(struct sl_backend *be, void *dx, void *dz, int zs, void *dw,
				   const void *dout, const void *x, const void *z, const void *w,
				   const void *rstd, int T, int nh, int d, float eps)
{
	sl_cuda_gated_rmsnorm_bwd(C(be), dx, dz, zs, dw, dout, x, z, w, rstd, T, nh, d, eps);
}

static void cuda_gattn_qk_fwd(struct sl_backend *be, void *out, void *gate, void *rstd,
			      const void *qgkv, const void *qw, const void *kw, int T, int L,
			      const int32_t *pos, int nh, int nkv, int hd, int rot, float eps,
			      float theta)
{
	sl_cuda_gattn_qk_fwd(C(be), out, gate, rstd, qgkv, qw, kw, T, L, pos, nh, nkv, hd, rot,
			     eps, theta);
}

static void cuda_gattn_qk_bwd(struct sl_backend *be, void *dqgkv, void *dqw, void *dkw,
			      const void *dout, const void *dgate, const void *qgkv, const void *qw,
			      const void *kw, const void *rstd, int T, int L, const int32_t *pos,
			      int nh, int nkv, int hd, int rot, float eps, float theta)
{
	sl_cuda_gattn_qk_bwd(C(be), dqgkv, dqw, dkw, dout, dgate, qgkv, qw, kw, rstd, T, L, pos,
			     nh, nkv, hd, rot, eps, theta);
}

static void cuda_sigmoid_mul_fwd(struct sl_backend *be, void *y, const void *x, const void *gate,
				 size_t n)
{
	sl_cuda_sigmoid_mul_fwd(C(be), y, x, gate, n);
}

static void cuda_sigmoid_mul_bwd(struct sl_backend *be, void *dx, void *dgate, const void *dy,
				 const void *x, const void *gate, size_t n)
{
	sl_cuda_sigmoid_mul_bwd(C(be), dx, dgate, dy, x, gate, n);
}

/* 0, or -1 with a message when SHARDLM_GDN_KERNEL names no kernel */
static int cuda_gdn_init(struct sl_backend *be)
{
	const char *k = getenv("SHARDLM_GDN_KERNEL");
	bool fused = k && !strcmp(k, "chunked-fused"), one = k && !strcmp(k, "chunked-1pass");
	bool chunked = !k || !*k || !strcmp(k, "chunked") || !strcmp(k, "chunked-3pass") ||
		       fused || one;	/* the default */

	const char *w = getenv("SHARDLM_GDN_WALK");
	int walk = w && !strcmp(w, "shared") ? 1 : w && !strcmp(w, "registers-state") ? 2 : 3;

	if (k && *k && !chunked && strcmp(k, "recurrent")) {
		fprintf(stderr,
			"cuda backend: SHARDLM_GDN_KERNEL=%s: expected chunked (or chunked-3pass), "
			"chunked-1pass, chunked-fused or recurrent\n", k);
		return -1;
	}
	if (w && *w && strcmp(w, "registers") && strcmp(w, "registers-state") &&
	    strcmp(w, "shared")) {
		fprintf(stderr,
			"cuda backend: SHARDLM_GDN_WALK=%s: expected registers, registers-state or "
			"shared\n", w);
		return -1;
	}
	/* per backend: a process may hold several */
	P(be)->gdn_fwd_split = fused || one ? 0 : walk;
	P(be)->gdn_bwd_split = fused ? 0 : walk;
	be->conv1d_silu_fwd = cuda_conv1d_silu_fwd;
	be->conv1d_silu_bwd = cuda_conv1d_silu_bwd;
	be->gdn_prep_fwd = cuda_gdn_prep_fwd;
	be->gdn_prep_bwd = cuda_gdn_prep_bwd;
	be->gdn_states_extra = chunked ? cuda_gdn_states_extra : NULL;
	be->gdn_rule_fwd = chunked ? cuda_gdn_chunk_fwd : cuda_gdn_rule_fwd;
	be->gdn_rule_bwd = chunked ? cuda_gdn_chunk_bwd : cuda_gdn_rule_bwd;
	be->gated_rmsnorm_fwd = cuda_gated_rmsnorm_fwd;
	be->gated_rmsnorm_bwd = cuda_gated_rmsnorm_bwd;
	be->gattn_qk_fwd = cuda_gattn_qk_fwd;
	be->gattn_qk_bwd = cuda_gattn_qk_bwd;
	be->sigmoid_mul_fwd = cuda_sigmoid_mul_fwd;
	be->sigmoid_mul_bwd = cuda_sigmoid_mul_bwd;
	return 0;
}
