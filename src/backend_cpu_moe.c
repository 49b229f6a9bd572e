/*
 * backend_cpu_moe: the cpu backend's mixture-of-experts ops (the reference for cuda/moe.cu).
 *
 * Included by backend_cpu.c (after its other ops, whose helpers it uses), so it is built twice:
 * with float and, for the gradient checks, with double compute elements (`real`).  Routing values
 * are stat buffers, of the compute type here.  Sums accumulate in double.
 */

/* ---- routing ----------------------------------------------------------------------------- */

static void cpu_moe_route_fwd(struct sl_backend *be, void *p, int32_t *topi, void *topw,
			      const void *logits, int T, int E, int k, bool norm)
{
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *z = (const real *)logits + (size_t)t * E;
		real *pt = (real *)p + (size_t)t * E, *wt = (real *)topw + (size_t)t * k;
		int32_t *it = topi + (size_t)t * k;
		double mx = -INFINITY, sum = 0, s = 0;

		for (int e = 0; e < E; e++)
			mx = fmax(mx, (double)z[e]);
		for (int e = 0; e < E; e++)
			sum += exp((double)z[e] - mx);
		for (int e = 0; e < E; e++)
			pt[e] = (real)(exp((double)z[e] - mx) / sum);
		/* k passes of argmax: strict > keeps the lower expert on ties */
		for (int j = 0; j < k; j++) {
			int best = -1;

			for (int e = 0; e < E; e++) {
				bool taken = false;

				for (int i = 0; i < j; i++)
					taken |= it[i] == e;
				if (!taken && (best < 0 || pt[e] > pt[best]))
					best = e;
			}
			it[j] = best;
			s += pt[best];
		}
		for (int j = 0; j < k; j++)
			wt[j] = norm ? (real)(pt[it[j]] / s) : pt[it[j]];
	}
}

static bool is_real_token(const int32_t *lens, int L, int t)
{
	return t % L < lens[t / L];
}

static void cpu_moe_route_bwd(struct sl_backend *be, void *dlogits, const void *dtopw,
			      const void *p, const int32_t *topi, const void *topw,
			      const void *aux_g, const int32_t *lens, int B, int L, int E, int k,
			      bool norm)
{
	const int T = B * L;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *pt = (const real *)p + (size_t)t * E;
		const real *dw = (const real *)dtopw + (size_t)t * k;
		const real *wt = (const real *)topw + (size_t)t * k;
		const int32_t *it = topi + (size_t)t * k;
		real *dz = (real *)dlogits + (size_t)t * E;
		const real *ag = aux_g && is_real_token(lens, L, t) ? aux_g : NULL;
		double dp[4096], s = 0, dot = 0, c = 0;

		for (int e = 0; e < E; e++)
			dp[e] = ag ? (double)ag[e] : 0;
		if (norm) {
			/* w_j = p_j / S:  dp_j = (dw_j - sum_m dw_m w_m) / S */
			for (int j = 0; j < k; j++) {
				s += pt[it[j]];
				dot += (double)dw[j] * wt[j];
			}
			for (int j = 0; j < k; j++)
				dp[it[j]] += ((double)dw[j] - dot) / s;
		} else {
			for (int j = 0; j < k; j++)
				dp[it[j]] += dw[j];
		}
		for (int e = 0; e < E; e++)
			c += pt[e] * dp[e];
		for (int e = 0; e < E; e++)
			dz[e] = (real)(pt[e] * (dp[e] - c));
	}
}

static void cpu_moe_aux_stats(struct sl_backend *be, double *stats, const void *p,
			      const int32_t *topi, const int32_t *lens, int B, int L, int E, int k)
{
	for (int t = 0; t < B * L; t++) {
		if (!is_real_token(lens, L, t))
			continue;
		for (int j = 0; j < k; j++)
			stats[topi[(size_t)t * k + j]] += 1;
		for (int e = 0; e < E; e++)
			stats[E + e] += ((const real *)p)[(size_t)t * E + e];
	}
}

/* ---- permutation ------------------------------------------------------------------------- */

static void cpu_moe_permute(struct sl_backend *be, int32_t *rows, int32_t *slot, int32_t *offs,
			    const int32_t *topi, int T, int E, int k)
{
	const int n = T * k;

	for (int e = 0; e <= E; e++)
		offs[e] = 0;
	for (int i = 0; i < n; i++)
		offs[topi[i] + 1]++;
	for (int e = 0; e < E; e++)
		offs[e + 1] += offs[e];
	/* choices in order: each expert's rows come out in token order (stable) */
	{
		int32_t *next = malloc((size_t)(E ? E : 1) * sizeof(*next));

		if (!next) {
			fprintf(stderr, "%s backend: out of memory\n", CPU_NAME);
			abort();
		}
		memcpy(next, offs, (size_t)E * sizeof(*next));
		for (int i = 0; i < n; i++) {
			int r = next[topi[i]]++;

			rows[r] = i / k;
			slot[i] = r;
		}
		free(next);
	}
}

/* ---- grouped matmul ---------------------------------------------------------------------- */

static void cpu_moe_gemm_fwd(struct sl_backend *be, void *out, const void *x, const void *w,
			     const int32_t *offs, const int *h_offs, int E, int K, int N,
			     size_t ws)
{
	for (int e = 0; e < E; e++) {
		int r0 = h_offs[e], n = h_offs[e + 1] - r0;

		if (n > 0)
			cpu_matmul_fwd(be, (real *)out + (size_t)r0 * N,
				       (const real *)x + (size_t)r0 * K,
				       (const real *)w + e * ws, NULL, n, K, N);
	}
}

static void cpu_moe_gemm_bwd(struct sl_backend *be, void *dx, void *dw, const void *dout,
			     const void *x, const void *w, const int32_t *offs, const int *h_offs,
			     int E, int K, int N, size_t ws, bool dw_set)
{
	for (int e = 0; dw_set && e < E; e++)
		memset((real *)dw + e * ws, 0, (size_t)N * K * sizeof(real));
	for (int e = 0; e < E; e++) {
		int r0 = h_offs[e], n = h_offs[e + 1] - r0;

		if (n > 0)
			cpu_matmul_bwd(be, dx ? (real *)dx + (size_t)r0 * K : NULL,
				       (real *)dw + e * ws, NULL,
				       (const real *)dout + (size_t)r0 * N,
				       (const real *)x + (size_t)r0 * K,
				       (const real *)w + e * ws, n, K, N, false);
	}
}

/* ---- combine ----------------------------------------------------------------------------- */

static void cpu_moe_combine_fwd(struct sl_backend *be, void *out, const void *y, const void *topw,
				const int32_t *slot, int T, int k, int H)
{
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		real *o = (real *)out + (size_t)t * H;

		for (int h = 0; h < H; h++) {
			double acc = 0;

			for (int j = 0; j < k; j++)
				acc += (double)((const real *)topw)[(size_t)t * k + j] *
				       ((const real *)y)[(size_t)slot[(size_t)t * k + j] * H + h];
			o[h] = (real)acc;
		}
	}
}

static void cpu_moe_combine_bwd(struct sl_backend *be, void *dy, void *dtopw, const void *dout,
				const void *y, const void *topw, const int32_t *slot, int T, int k,
				int H)
{
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *g = (const real *)dout + (size_t)t * H;

		for (int j = 0; j < k; j++) {
			size_t r = (size_t)slot[(size_t)t * k + j];
			const real *yr = (const real *)y + r * H;
			real *dr = (real *)dy + r * H;
			real wj = ((const real *)topw)[(size_t)t * k + j];
			double dot = 0;

			for (int h = 0; h < H; h++) {
				dot += (double)g[h] * yr[h];
				dr[h] = wj * g[h];
			}
			((real *)dtopw)[(size_t)t * k + j] = (real)dot;
		}
	}
}

static void cpu_moe_install(struct sl_backend *be)
{
	be->moe_route_fwd = cpu_moe_route_fwd;
	be->moe_route_bwd = cpu_moe_route_bwd;
	be->moe_aux_stats = cpu_moe_aux_stats;
	be->moe_permute = cpu_moe_permute;
	be->moe_gemm_fwd = cpu_moe_gemm_fwd;
	be->moe_gemm_bwd = cpu_moe_gemm_bwd;
	be->moe_dw_set = true;
	be->moe_combine_fwd = cpu_moe_combine_fwd;
	be->moe_combine_bwd = cpu_moe_combine_bwd;
}
