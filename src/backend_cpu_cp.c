/*
 * backend_cpu_cp: the cpu backend's context-parallel ops (parallel.context; backend.h).
 *
 * Included by backend_cpu.c after its other ops (it uses dot() and xmalloc()), so it is built
 * for float and double compute elements.  The attention loops follow cpu_attention_fwd/_bwd
 * key for key (same order of sums), with each local query's row index and document start read
 * from gidx and pos instead of being its position in a contiguous row.
 */

static void cpu_copy_cols(struct sl_backend *be, void *dst, int dst_w, int dst_off,
			  const void *src, int src_w, int src_off, int T, int n, bool add)
{
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		real *d = (real *)dst + (size_t)t * dst_w + dst_off;
		const real *s = (const real *)src + (size_t)t * src_w + src_off;

		if (add) {
			for (int i = 0; i < n; i++)
				d[i] += s[i];
		} else {
			memmove(d, s, (size_t)n * sizeof(real));
		}
	}
}

/*
 * As attend() for the keys j0..i whose chunk (of @ch tokens) rank @me holds (@mine) or does not;
 * y = 0 and -inf when there is none.
 */
static double attend_part(real *y, const real *q, const real *kb, const real *vb, size_t stride,
			  int j0, int i, int hd, double scale, double *p, double *acc, int ch,
			  int me, int C, bool mine)
{
	double mx = -INFINITY, sum = 0;

	for (int j = j0; j <= i; j++) {
		int c = j / ch, owner = c < C ? c : 2 * C - 1 - c;

		p[j] = -INFINITY;
		if ((owner == me) != mine)
			continue;
		p[j] = dot(q, kb + (size_t)j * stride, hd) * scale;
		if (p[j] > mx)
			mx = p[j];
	}
	for (int d = 0; d < hd; d++)
		acc[d] = 0;
	if (mx == -INFINITY) {
		for (int d = 0; d < hd; d++)
			y[d] = 0;
		return -INFINITY;
	}
	for (int j = j0; j <= i; j++) {
		const real *v = vb + (size_t)j * stride;
		double e;

		if (p[j] == -INFINITY)
			continue;
		e = exp(p[j] - mx);
		sum += e;
		for (int d = 0; d < hd; d++)
			acc[d] += e * v[d];
	}
	for (int d = 0; d < hd; d++)
		y[d] = (real)(acc[d] / sum);
	return mx + log(sum);
}

/* (y, l) = the softmax-weighted union of (y, l) and (y2, l2), two disjoint key sets' */
static real merge_part(real *y, double l, const real *y2, double l2, int hd)
{
	double m, w1, w2;

	if (l2 == -INFINITY)
		return (real)l;
	m = l > l2 ? l : l2;
	w1 = exp(l - m);
	w2 = exp(l2 - m);
	for (int d = 0; d < hd; d++)
		y[d] = (real)((w1 * y[d] + w2 * y2[d]) / (w1 + w2));
	return (real)(m + log(w1 + w2));
}

static void cpu_cp_attention_fwd(struct sl_backend *be, void *out, void *lse, const void *qkv,
				 const void *kv, const int32_t *gidx, const int32_t *pos,
				 const int32_t *lens, int B, int Lc, int L, int nh, int nkv, int hd,
				 int me, int C, int part)
{
	const int W = (nh + 2 * nkv) * hd, KW = 2 * nkv * hd, grp = nh / nkv, ch = L / (2 * C);
	const double scale = 1.0 / sqrt((double)hd);
	const real *in = qkv, *kvb = kv;
	real *o = out, *ls = lse;

#pragma omp parallel
	{
		double *p = xmalloc((size_t)L * sizeof(double));
		double *acc = xmalloc((size_t)hd * sizeof(double));
		real *y2 = xmalloc((size_t)hd * sizeof(real));

#pragma omp for collapse(3) schedule(dynamic, 4)
		for (int b = 0; b < B; b++) {
			for (int h = 0; h < nh; h++) {
				for (int il = 0; il < Lc; il++) {
					size_t t = (size_t)b * Lc + il;
					const int i = gidx[t];
					real *y = o + t * nh * hd + (size_t)h * hd;
					const real *q = in + t * W + (size_t)h * hd;
					const real *kb = kvb + (size_t)b * L * KW +
							 (size_t)(h / grp) * hd;
					const real *vb = kb + (size_t)nkv * hd;
					int j0;

					if (i >= lens[b]) {
						if (part != 2) {
							memset(y, 0, (size_t)hd * sizeof(real));
							ls[t * nh + h] = 0;
						}
						continue;
					}
					j0 = i - pos[t];
					if (part == 0) {
						ls[t * nh + h] = attend(y, q, kb, vb, KW, j0, i, hd,
									scale, p, acc);
					} else if (part == 1) {
						/* key i is the query's own: never empty */
						ls[t * nh + h] = (real)attend_part(y, q, kb, vb, KW,
							j0, i, hd, scale, p, acc, ch, me, C, true);
					} else {
						double l2 = attend_part(y2, q, kb, vb, KW, j0, i, hd,
							scale, p, acc, ch, me, C, false);

						ls[t * nh + h] = merge_part(y, ls[t * nh + h], y2, l2,
									    hd);
					}
				}
			}
		}
		free(y2);
		free(acc);
		free(p);
	}
}

/* As cpu_attention_bwd, each local query's row and document start from gidx and pos. */
static void cpu_cp_attention_bwd(struct sl_backend *be, void *dqkv, void *dkv, const void *dout,
				 const void *out, const void *lse, const void *qkv, const void *kv,
				 const int32_t *gidx, const int32_t *pos, const int32_t *lens,
				 int B, int Lc, int L, int nh, int nkv, int hd)
{
	attention_bwd_rows(dqkv, dkv, dout, out, lse, qkv, kv, 2 * nkv * hd, 0, gidx, pos, lens,
			   B, Lc, L, nh, nkv, hd);
}

static void cpu_cp_install(struct sl_backend *be)
{
	be->copy_cols = cpu_copy_cols;
	be->cp_attention_fwd = cpu_cp_attention_fwd;
	be->cp_attention_bwd = cpu_cp_attention_bwd;
}
