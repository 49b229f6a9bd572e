/*
 * backend_cpu_gdn: the cpu backend's ops for the Qwen3.5 hybrid layers (issue 12): the causal
 * depthwise convolution, the Gated DeltaNet inputs and its gated delta rule, the gated RMSNorm,
 * and the gated attention's q/k (partial rotary, output gate).
 *
 * Not compiled on its own: backend_cpu.c includes it, so it is built with float compute elements
 * and, through backend_cpu64.c, with double ones (the `real` type).  The delta rule runs as the
 * plain recurrence over each record's positions (the numeric reference; the cuda backend uses the
 * chunked form).  Its state is kept in double and rounded to `real` at every 64-position chunk
 * start, where the forward saves it: the backward recomputes each chunk's states from that saved
 * value, so it sees exactly the states the forward used.
 */

#define GDN_CHUNK 64

static inline double sigm(double x)
{
	return 1.0 / (1.0 + exp(-x));
}

/* torch.nn.functional.softplus (beta 1, threshold 20) and its derivative */
static inline double softplus20(double x)
{
	return x > 20 ? x : log1p(exp(x));
}

static inline double softplus20_grad(double x)
{
	return x > 20 ? 1.0 : sigm(x);
}

/* ---- causal depthwise conv1d + SiLU -------------------------------------------------------- */

/* x(t - back, c) of record row t (position p), or the halo's row for a position before 0 */
static inline double conv_in(const real *x, const real *halo, int xs, int t, int p, int back,
			     int L, int K, int c)
{
	if (p - back >= 0)
		return x[(size_t)(t - back) * xs + c];
	if (!halo)
		return 0;
	return halo[((size_t)(t / L) * (K - 1) + (K - 1) + (p - back)) * xs + c];
}

static void cpu_conv1d_silu_fwd(struct sl_backend *be, void *out, void *pre, const void *x,
				int xs, const void *w, int T, int L, int C, int K,
				const void *halo)
{
	const real *xx = x, *ww = w, *hh = halo;
	real *o = out, *pr = pre;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		int p = t % L;

		for (int c = 0; c < C; c++) {
			double acc = 0;

			for (int j = 0; j < K; j++)
				acc += conv_in(xx, hh, xs, t, p, K - 1 - j, L, K, c) *
				       ww[(size_t)c * K + j];
			pr[(size_t)t * C + c] = (real)acc;
			o[(size_t)t * C + c] = (real)(acc * sigm(acc));
		}
	}
}

static void cpu_conv1d_silu_bwd(struct sl_backend *be, void *dx, int xs, void *dw,
				const void *dout, const void *x, const void *pre, const void *w,
				int T, int L, int C, int K, const void *halo, void *dhalo)
{
	const real *g = dout, *xx = x, *pr = pre, *ww = w, *hh = halo;
	real *d = dx, *dww = dw, *dh = dhalo;
	double *dp = xmalloc((size_t)T * C * sizeof(double));

#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < (size_t)T * C; i++) {
		double u = pr[i], s = sigm(u);

		dp[i] = g[i] * s * (1 + u * (1 - s));
	}
	/* dx(t', c) = sum over the outputs t = t' + back of the same record */
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		int p = t % L;

		for (int c = 0; c < C; c++) {
			double acc = 0;

			for (int j = 0; j < K; j++) {
				int back = K - 1 - j;

				if (p + back >= L)
					continue;
				acc += dp[(size_t)(t + back) * C + c] * ww[(size_t)c * K + j];
			}
			d[(size_t)t * xs + c] = (real)acc;
		}
	}
	/* the halo's row i (position i - K + 1) feeds the outputs p = i - K + 1 + back >= 0 */
	if (dh) {
#pragma omp parallel for schedule(static)
		for (int r = 0; r < T / L * (K - 1); r++) {
			int rec = r / (K - 1), i = r % (K - 1);

			for (int c = 0; c < C; c++) {
				double acc = 0;

				for (int j = 0; j < K; j++) {
					int p = i - (K - 1) + (K - 1 - j);

					if (p >= 0 && p < L)
						acc += dp[((size_t)rec * L + p) * C + c] *
						       ww[(size_t)c * K + j];
				}
				dh[(size_t)r * xs + c] = (real)acc;
			}
		}
	}
#pragma omp parallel for schedule(static)
	for (int c = 0; c < C; c++) {
		for (int j = 0; j < K; j++) {
			int back = K - 1 - j;
			double acc = 0;

			for (int t = 0; t < T; t++)
				acc += dp[(size_t)t * C + c] *
				       conv_in(xx, hh, xs, t, t % L, back, L, K, c);
			dww[(size_t)c * K + j] += (real)acc;
		}
	}
	free(dp);
}

/* ---- Gated DeltaNet inputs ------------------------------------------------------------------ */

static void cpu_gdn_prep_fwd(struct sl_backend *be, void *qn, void *kn, void *rqk, void *beta,
			     void *g, const void *qkv, const void *ab, int abs, const void *A_log,
			     const void *dt_bias, int T, int nk, int nv, int dk, int dv)
{
	const int C = 2 * nk * dk + nv * dv;
	const double scale = 1.0 / sqrt((double)dk);
	const real *in = qkv, *abb = ab, *al = A_log, *dtb = dt_bias;
	real *qo = qn, *ko = kn, *r = rqk, *bo = beta, *go = g;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		for (int j = 0; j < 2 * nk; j++) {
			const real *x = in + (size_t)t * C + (size_t)j * dk;
			real *y = (j < nk ? qo : ko) + (size_t)t * nk * dk + (size_t)(j % nk) * dk;
			double ss = 0, rr, sc = j < nk ? scale : 1.0;

			for (int i = 0; i < dk; i++)
				ss += (double)x[i] * x[i];
			rr = 1.0 / sqrt(ss + 1e-6);
			r[(size_t)t * 2 * nk + j] = (real)rr;
			for (int i = 0; i < dk; i++)
				y[i] = (real)(x[i] * rr * sc);
		}
		for (int h = 0; h < nv; h++) {
			double b = abb[(size_t)t * abs + h], a = abb[(size_t)t * abs + nv + h];

			bo[(size_t)t * nv + h] = (real)sigm(b);
			go[(size_t)t * nv + h] = (real)(-exp((double)al[h]) *
							softplus20(a + (double)dtb[h]));
		}
	}
}

static void cpu_gdn_prep_bwd(struct sl_backend *be, void *dqkv, void *dab, int abs,
			     void *dA_log, void *ddt_bias, const void *dqn, const void *dkn,
			     const void *dbeta, const void *dg, const void *qkv, const void *ab,
			     const void *rqk, const void *beta, const void *g, const void *A_log,
			     const void *dt_bias, int T, int nk, int nv, int dk, int dv)
{
	const int C = 2 * nk * dk + nv * dv;
	const double scale = 1.0 / sqrt((double)dk);
	const real *in = qkv, *abb = ab, *r = rqk, *bt = beta, *gg = g, *al = A_log;
	const real *dtb = dt_bias, *gq = dqn, *gk = dkn, *gb = dbeta, *gd = dg;
	real *d = dqkv, *dabb = dab;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		for (int j = 0; j < 2 * nk; j++) {
			const real *x = in + (size_t)t * C + (size_t)j * dk;
			const real *dy = (j < nk ? gq : gk) + (size_t)t * nk * dk +
					 (size_t)(j % nk) * dk;
			real *dx = d + (size_t)t * C + (size_t)j * dk;
			double rr = r[(size_t)t * 2 * nk + j], sc = j < nk ? scale : 1.0, s = 0;

			for (int i = 0; i < dk; i++)
				s += (double)x[i] * dy[i];
			for (int i = 0; i < dk; i++)
				dx[i] = (real)(sc * (rr * dy[i] - rr * rr * rr * x[i] * s));
		}
		for (int h = 0; h < nv; h++) {
			double b = bt[(size_t)t * nv + h];
			double u = abb[(size_t)t * abs + nv + h] + (double)dtb[h];

			dabb[(size_t)t * abs + h] = (real)(gb[(size_t)t * nv + h] * b * (1 - b));
			dabb[(size_t)t * abs + nv + h] = (real)(gd[(size_t)t * nv + h] *
								-exp((double)al[h]) *
								softplus20_grad(u));
		}
	}
	for (int h = 0; h < nv; h++) {
		double sa = 0, sd = 0;

		for (int t = 0; t < T; t++) {
			double u = abb[(size_t)t * abs + nv + h] + (double)dtb[h];
			double gdt = gd[(size_t)t * nv + h];

			sa += gdt * gg[(size_t)t * nv + h];	/* dg/dA_log = g */
			sd += gdt * -exp((double)al[h]) * softplus20_grad(u);
		}
		((real *)dA_log)[h] += (real)sa;
		((real *)ddt_bias)[h] += (real)sd;
	}
}

/* ---- the gated delta rule -------------------------------------------------------------------- */

/* one step of the recurrence on S (dk x dv, row i = key dim): S = gam S; S += k (beta (v - S^T k))^T */
static void gdn_step(double *S, const real *k, const real *v, double gam, double bet, int dk,
		     int dv, double *pred)
{
	for (size_t i = 0; i < (size_t)dk * dv; i++)
		S[i] *= gam;
	for (int j = 0; j < dv; j++)
		pred[j] = 0;
	for (int i = 0; i < dk; i++)
		for (int j = 0; j < dv; j++)
			pred[j] += S[(size_t)i * dv + j] * k[i];
	for (int i = 0; i < dk; i++)
		for (int j = 0; j < dv; j++)
			S[(size_t)i * dv + j] += k[i] * bet * (v[j] - pred[j]);
}

static void cpu_gdn_rule_fwd(struct sl_backend *be, void *o, void *states, const void *qn,
			     const void *kn, const void *v, int vs, const void *beta,
			     const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			     int nv, int dk, int dv, const void *s0, void *s_end)
{
	const int nch = (L + GDN_CHUNK - 1) / GDN_CHUNK, grp = nv / nk;
	const size_t SS = (size_t)dk * dv;
	const real *q = qn, *k = kn, *vv = v, *bt = beta, *gg = g, *si = s0;
	real *out = o, *st = states, *se = s_end;

#pragma omp parallel for schedule(dynamic)
	for (int bh = 0; bh < B * nv; bh++) {
		int b = bh / nv, h = bh % nv, kh = h / grp, len = lens[b];
		double *S = xmalloc((SS + dv) * sizeof(double)), *pred = S + SS;

		for (size_t i = 0; i < SS; i++)
			S[i] = si ? si[(size_t)bh * SS + i] : 0;
		for (int p = 0; p < L; p++) {
			size_t t = (size_t)b * rs + p;
			real *orow = out + t * nv * dv + (size_t)h * dv;

			if (p % GDN_CHUNK == 0) {
				real *sv = st + (((size_t)b * nch + p / GDN_CHUNK) * nv + h) * SS;

				for (size_t i = 0; i < SS; i++) {
					sv[i] = (real)S[i];
					S[i] = sv[i];
				}
			}
			if (p >= len) {
				memset(orow, 0, (size_t)dv * sizeof(real));
				continue;
			}
			{
				const real *kt = k + t * nk * dk + (size_t)kh * dk;
				const real *qt = q + t * nk * dk + (size_t)kh * dk;

				gdn_step(S, kt, vv + t * vs + (size_t)h * dv,
					 exp((double)gg[t * nv + h]), bt[t * nv + h], dk, dv, pred);
				for (int j = 0; j < dv; j++) {
					double acc = 0;

					for (int i = 0; i < dk; i++)
						acc += S[(size_t)i * dv + j] * qt[i];
					orow[j] = (real)acc;
				}
			}
		}
		if (se)
			for (size_t i = 0; i < SS; i++)
				se[(size_t)bh * SS + i] = (real)S[i];
		free(S);
	}
}

static void cpu_gdn_rule_bwd(struct sl_backend *be, void *dqn, void *dkn, void *dv_, void *dbeta,
			     void *dg, const void *dout, const void *states, const void *qn,
			     const void *kn, const void *v, int vs, const void *beta,
			     const void *g, const int32_t *lens, int B, int L, int rs, int nk,
			     int nv, int dk, int dv, const void *ds_end, void *ds0)
{
	const int nch = (L + GDN_CHUNK - 1) / GDN_CHUNK, grp = nv / nk;
	const size_t SS = (size_t)dk * dv;
	const real *q = qn, *k = kn, *vv = v, *bt = beta, *gg = g, *go = dout, *st = states;
	const real *dse = ds_end;
	real *gq = dqn, *gk = dkn, *gv = dv_, *gb = dbeta, *gdd = dg, *gs0 = ds0;

	/* one task per (record, key head): the value heads sharing a key head add into its dq, dk */
#pragma omp parallel for schedule(dynamic)
	for (int bk = 0; bk < B * nk; bk++) {
		int b = bk / nk, kh = bk % nk, len = lens[b];
		/* the states of one chunk (S_{p-1} before step p at [p - c0]), dS, scratch */
		double *Sc = xmalloc(((GDN_CHUNK + 1) * SS + SS + 4 * (size_t)dv + 2 * dk) *
				     sizeof(double));
		double *dS = Sc + (GDN_CHUNK + 1) * SS, *pred = dS + SS, *delta = pred + dv;
		double *ddelta = delta + dv, *dpred = ddelta + dv, *dqa = dpred + dv;
		double *dka = dqa + dk;

		for (int p = 0; p < L; p++) {
			size_t t = (size_t)b * rs + p;

			memset(gq + t * nk * dk + (size_t)kh * dk, 0, (size_t)dk * sizeof(real));
			memset(gk + t * nk * dk + (size_t)kh * dk, 0, (size_t)dk * sizeof(real));
		}
		for (int h = kh * grp; h < (kh + 1) * grp; h++) {
			for (int p = len; p < L; p++) {
				size_t t = (size_t)b * rs + p;

				memset(gv + t * vs + (size_t)h * dv, 0, (size_t)dv * sizeof(real));
				gb[t * nv + h] = 0;
				gdd[t * nv + h] = 0;
			}
			for (size_t i = 0; i < SS; i++)
				dS[i] = dse ? dse[((size_t)b * nv + h) * SS + i] : 0;
			/* no position: the state passes through (len - 1 < 0 runs no chunk) */
			for (int c = len > 0 ? (len - 1) / GDN_CHUNK : -1; c >= 0; c--) {
				int c0 = c * GDN_CHUNK, c1 = c0 + GDN_CHUNK < len ? c0 + GDN_CHUNK : len;
				const real *sv = st + (((size_t)b * nch + c) * nv + h) * SS;

				for (size_t i = 0; i < SS; i++)
					Sc[i] = sv[i];
				for (int p = c0; p < c1; p++) {
					size_t t = (size_t)b * rs + p;
					double *Sn = Sc + (size_t)(p - c0 + 1) * SS;

					memcpy(Sn, Sn - SS, SS * sizeof(double));
					gdn_step(Sn, k + t * nk * dk + (size_t)kh * dk,
						 vv + t * vs + (size_t)h * dv,
						 exp((double)gg[t * nv + h]), bt[t * nv + h], dk, dv,
						 pred);
				}
				for (int p = c1 - 1; p >= c0; p--) {
					size_t t = (size_t)b * rs + p;
					const double *Sp = Sc + (size_t)(p - c0) * SS;	/* S_{p-1} */
					const double *Sn = Sp + SS;			/* S_p */
					const real *kt = k + t * nk * dk + (size_t)kh * dk;
					const real *qt = q + t * nk * dk + (size_t)kh * dk;
					const real *vt = vv + t * vs + (size_t)h * dv;
					const real *dot_ = go + t * nv * dv + (size_t)h * dv;
					double gam = exp((double)gg[t * nv + h]), bet = bt[t * nv + h];
					double dbet = 0, dgam = 0;

					/* o = S_p^T q */
					for (int i = 0; i < dk; i++) {
						double a = 0;

						for (int j = 0; j < dv; j++) {
							a += Sn[(size_t)i * dv + j] * dot_[j];
							dS[(size_t)i * dv + j] += qt[i] * dot_[j];
						}
						dqa[i] = a;
					}
					/* S_p = S_a + k delta^T, S_a = gam S_{p-1}, pred = S_a^T k */
					for (int j = 0; j < dv; j++) {
						double pr = 0, dd = 0;

						for (int i = 0; i < dk; i++) {
							pr += gam * Sp[(size_t)i * dv + j] * kt[i];
							dd += dS[(size_t)i * dv + j] * kt[i];
						}
						pred[j] = pr;
						delta[j] = bet * (vt[j] - pr);
						ddelta[j] = dd;
						dbet += dd * (vt[j] - pr);
						dpred[j] = -bet * dd;
						gv[t * vs + (size_t)h * dv + j] = (real)(bet * dd);
					}
					for (int i = 0; i < dk; i++) {
						double a = 0;

						for (int j = 0; j < dv; j++) {
							double *ds = &dS[(size_t)i * dv + j];

							a += *ds * delta[j] +
							     gam * Sp[(size_t)i * dv + j] * dpred[j];
							*ds += kt[i] * dpred[j];	/* dS_a */
							dgam += *ds * Sp[(size_t)i * dv + j];
							*ds *= gam;			/* dS_{p-1} */
						}
						dka[i] = a;
					}
					gb[t * nv + h] = (real)dbet;
					gdd[t * nv + h] = (real)(gam * dgam);
					for (int i = 0; i < dk; i++) {
						gq[t * nk * dk + (size_t)kh * dk + i] += (real)dqa[i];
						gk[t * nk * dk + (size_t)kh * dk + i] += (real)dka[i];
					}
				}
			}
			if (gs0)
				for (size_t i = 0; i < SS; i++)
					gs0[((size_t)b * nv + h) * SS + i] = (real)dS[i];
		}
		free(Sc);
	}
}

/* ---- gated RMSNorm ------------------------------------------------------------------------- */

static void cpu_gated_rmsnorm_fwd(struct sl_backend *be, void *out, void *rstd, const void *x,
				  const void *z, int zs, const void *w, int T, int nh, int d,
				  float eps)
{
	const real *xx = x, *zz = z, *ww = w;
	real *o = out, *rs = rstd;

#pragma omp parallel for schedule(static)
	for (int th = 0; th < T * nh; th++) {
		int t = th / nh, h = th % nh;
		const real *xr = xx + (size_t)th * d, *zr = zz + (size_t)t * zs + (size_t)h * d;
		double ss = 0, r;

		for (int i = 0; i < d; i++)
			ss += (double)xr[i] * xr[i];
		r = 1.0 / sqrt(ss / d + eps);
		rs[th] = (real)r;
		for (int i = 0; i < d; i++)
			o[(size_t)th * d + i] = (real)(ww[i] * (xr[i] * r) * zr[i] * sigm(zr[i]));
	}
}

static void cpu_gated_rmsnorm_bwd(struct sl_backend *be, void *dx, void *dz, int zs, void *dw,
				  const void *dout, const void *x, const void *z, const void *w,
				  const void *rstd, int T, int nh, int d, float eps)
{
	const real *g = dout, *xx = x, *zz = z, *ww = w, *rs = rstd;
	real *dxx = dx, *dzz = dz, *dww = dw;

#pragma omp parallel for schedule(static)
	for (int th = 0; th < T * nh; th++) {
		int t = th / nh, h = th % nh;
		const real *xr = xx + (size_t)th * d, *zr = zz + (size_t)t * zs + (size_t)h * d;
		const real *gr = g + (size_t)th * d;
		double r = rs[th], s = 0;

		for (int i = 0; i < d; i++) {
			double sz = sigm(zr[i]);

			s += gr[i] * ww[i] * zr[i] * sz * xr[i];	/* dxhat . x */
			dzz[(size_t)t * zs + (size_t)h * d + i] =
				(real)(gr[i] * ww[i] * xr[i] * r * sz * (1 + zr[i] * (1 - sz)));
		}
		for (int i = 0; i < d; i++) {
			double dxh = gr[i] * ww[i] * zr[i] * sigm(zr[i]);

			dxx[(size_t)th * d + i] = (real)(r * dxh - xr[i] * s * r * r * r / d);
		}
	}
#pragma omp parallel for schedule(static)
	for (int i = 0; i < d; i++) {
		double acc = 0;

		for (int th = 0; th < T * nh; th++) {
			int t = th / nh, h = th % nh;
			double zv = zz[(size_t)t * zs + (size_t)h * d + i];

			acc += (double)g[(size_t)th * d + i] * xx[(size_t)th * d + i] * rs[th] * zv *
			       sigm(zv);
		}
		dww[i] += (real)acc;
	}
}

/* ---- gated attention: q/k norm, partial rotary, the output gate ------------------------------ */

/* cos at cs[p*rot + i], sin at cs[p*rot + rot/2 + i], i < rot/2, inv_freq_i = theta^(-2i/rot) */
static real *rope_table_partial(int L, int rot, double theta)
{
	int half = rot / 2;
	real *cs = xmalloc((size_t)L * (rot ? rot : 1) * sizeof(real));

	for (int p = 0; p < L; p++)
		for (int i = 0; i < half; i++) {
			double ang = p * pow(theta, -2.0 * i / rot);

			cs[(size_t)p * rot + i] = (real)cos(ang);
			cs[(size_t)p * rot + half + i] = (real)sin(ang);
		}
	return cs;
}

static void cpu_gattn_qk_fwd(struct sl_backend *be, void *out, void *gate, void *rstd,
			     const void *qgkv, const void *qw, const void *kw, int T, int L,
			     const int32_t *pos, int nh, int nkv, int hd, int rot, float eps,
			     float theta)
{
	const int Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd, nq = nh + nkv;
	const int half = rot / 2;
	const real *in = qgkv;
	real *o = out, *gt = gate, *rs = rstd;
	real *cs = rope_table_partial(L, rot, theta);

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;

		for (int j = 0; j < nq; j++) {
			const real *x = in + (size_t)t * Win +
					(j < nh ? (size_t)j * 2 * hd : (size_t)(2 * nh + j - nh) * hd);
			const real *w = j < nh ? (const real *)qw : (const real *)kw;
			real *y = o + (size_t)t * Wout + (size_t)j * hd;
			double ss = 0, r, n[hd];

			for (int i = 0; i < hd; i++)
				ss += (double)x[i] * x[i];
			r = 1.0 / sqrt(ss / hd + eps);
			rs[(size_t)t * nq + j] = (real)r;
			for (int i = 0; i < hd; i++)
				n[i] = (double)(real)(x[i] * r) * w[i];
			for (int i = 0; i < half; i++) {
				y[i] = (real)(n[i] * c[i] - n[i + half] * s[i]);
				y[i + half] = (real)(n[i + half] * c[i] + n[i] * s[i]);
			}
			for (int i = rot; i < hd; i++)
				y[i] = (real)n[i];
			if (j < nh)
				memcpy(gt + (size_t)t * nh * hd + (size_t)j * hd, x + hd,
				       (size_t)hd * sizeof(real));
		}
		memcpy(o + (size_t)t * Wout + (size_t)nq * hd,
		       in + (size_t)t * Win + (size_t)(2 * nh + nkv) * hd,
		       (size_t)nkv * hd * sizeof(real));
	}
	free(cs);
}

/* gradient w.r.t. normed value i of a head from the partially rotated gradient dy */
static inline double prope_back(const real *dy, const real *c, const real *s, int i, int half,
				int rot)
{
	if (i >= rot)
		return dy[i];
	return rope_back(dy, c, s, i, half);
}

static void cpu_gattn_qk_bwd(struct sl_backend *be, void *dqgkv, void *dqw, void *dkw,
			     const void *dout, const void *dgate, const void *qgkv, const void *qw,
			     const void *kw, const void *rstd, int T, int L, const int32_t *pos,
			     int nh, int nkv, int hd, int rot, float eps, float theta)
{
	const int Win = (2 * nh + 2 * nkv) * hd, Wout = (nh + 2 * nkv) * hd, nq = nh + nkv;
	const int half = rot / 2;
	const real *g = dout, *dgt = dgate, *in = qgkv, *rs = rstd;
	real *d = dqgkv;
	real *cs = rope_table_partial(L, rot, theta);

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		const real *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;
		double dn[hd];

		for (int j = 0; j < nq; j++) {
			size_t ioff = (size_t)t * Win +
				      (j < nh ? (size_t)j * 2 * hd : (size_t)(2 * nh + j - nh) * hd);
			const real *x = in + ioff;
			const real *dy = g + (size_t)t * Wout + (size_t)j * hd;
			const real *w = j < nh ? (const real *)qw : (const real *)kw;
			real *dx = d + ioff;
			double r = rs[(size_t)t * nq + j], sum = 0, k;

			for (int i = 0; i < hd; i++) {
				dn[i] = prope_back(dy, c, s, i, half, rot);
				sum += dn[i] * w[i] * x[i];
			}
			k = sum * r * r * r / hd;
			for (int i = 0; i < hd; i++)
				dx[i] = (real)(r * w[i] * dn[i] - x[i] * k);
			if (j < nh)
				memcpy(dx + hd, dgt + (size_t)t * nh * hd + (size_t)j * hd,
				       (size_t)hd * sizeof(real));
		}
		memcpy(d + (size_t)t * Win + (size_t)(2 * nh + nkv) * hd,
		       g + (size_t)t * Wout + (size_t)nq * hd, (size_t)nkv * hd * sizeof(real));
	}

#pragma omp parallel for schedule(static)
	for (int ii = 0; ii < 2 * hd; ii++) {
		int kind = ii / hd, i = ii % hd;
		int j0 = kind ? nh : 0, j1 = kind ? nq : nh;
		double acc = 0;

		for (int t = 0; t < T; t++) {
			const real *c = cs + (size_t)(pos ? pos[t] : t % L) * rot, *s = c + half;

			for (int j = j0; j < j1; j++) {
				size_t ioff = (size_t)t * Win + (j < nh ? (size_t)j * 2 * hd :
									   (size_t)(2 * nh + j - nh) * hd);

				acc += prope_back(g + (size_t)t * Wout + (size_t)j * hd, c, s, i, half,
						  rot) * in[ioff + i] * rs[(size_t)t * nq + j];
			}
		}
		if (kind)
			((real *)dkw)[i] += (real)acc;
		else
			((real *)dqw)[i] += (real)acc;
	}
	free(cs);
}

static void cpu_sigmoid_mul_fwd(struct sl_backend *be, void *y, const void *x, const void *gate,
				size_t n)
{
	const real *xx = x, *gg = gate;
	real *yy = y;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		yy[i] = (real)(xx[i] * sigm(gg[i]));
}

static void cpu_sigmoid_mul_bwd(struct sl_backend *be, void *dx, void *dgate, const void *dy,
				const void *x, const void *gate, size_t n)
{
	const real *g = dy, *xx = x, *gg = gate;
	real *dxx = dx, *dg = dgate;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++) {
		double s = sigm(gg[i]);

		dxx[i] = (real)(g[i] * s);
		dg[i] = (real)(g[i] * xx[i] * s * (1 - s));
	}
}

static void cpu_gdn_init(struct sl_backend *be)
{
	be->conv1d_silu_fwd = cpu_conv1d_silu_fwd;
	be->conv1d_silu_bwd = cpu_conv1d_silu_bwd;
	be->gdn_prep_fwd = cpu_gdn_prep_fwd;
	be->gdn_prep_bwd = cpu_gdn_prep_bwd;
	be->gdn_rule_fwd = cpu_gdn_rule_fwd;
	be->gdn_rule_bwd = cpu_gdn_rule_bwd;
	be->gated_rmsnorm_fwd = cpu_gated_rmsnorm_fwd;
	be->gated_rmsnorm_bwd = cpu_gated_rmsnorm_bwd;
	be->gattn_qk_fwd = cpu_gattn_qk_fwd;
	be->gattn_qk_bwd = cpu_gattn_qk_bwd;
	be->sigmoid_mul_fwd = cpu_sigmoid_mul_fwd;
	be->sigmoid_mul_bwd = cpu_sigmoid_mul_bwd;
}
