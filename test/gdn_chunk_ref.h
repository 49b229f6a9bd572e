/*
 * gdn_chunk_ref.h: a host-side reference of the CHUNKED gated delta rule (the algorithm of
 * cuda/gdn_chunk.cu), in double, laid out as its three kernels so that they only transcribe it:
 *   ref_fwd          per (record, value head): chunk after chunk, o and the chunk-start states;
 *   ref_bwd_states   per (record, value head): the chunks backwards, dS at every chunk's end;
 *   ref_bwd_grads    per (record, key head, chunk): every gradient of the chunk, the value heads
 *                    of the key head in order.
 * test_gdn_chunk.c holds them to the cpu backend's plain recurrence (cpu64).
 *
 * The chunked form, per chunk of C positions (r, s < C; positions past the record's length
 * masked to k = q = 0, beta = g = 0, so that they change nothing), with S0 the state at the
 * chunk's start:
 *   G = cumsum(g), Ga_r = exp(G_r), e_r = exp(G_{C-1} - G_r), E_rs = exp(G_r - G_s) (s <= r)
 *   A_rs = beta_r E_rs k_r.k_s (s < r), P_rs = E_rs q_r.k_s (s <= r), T = (I + A)^-1
 *   delta = T diag(beta) (V - diag(Ga) K S0)           (the per-position deltas, C x dv)
 *   O = diag(Ga) Q S0 + P delta,  S_end = Ga_{C-1} S0 + K^T diag(e) delta
 * and backwards, from dO and dS_end:
 *   ddelta = P^T dO + diag(e) K dS_end
 *   dS0 = Q^T diag(Ga) dO + Ga_{C-1} dS_end - K^T diag(beta Ga) T^T ddelta
 * Not compiled on its own: included by test_gdn_chunk.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RC 64	/* positions per chunk (GDN_CHUNK) */

struct rchunk {
	int dk, dv;
	double *K, *Q, *V, *dO;		/* (RC, dk), (RC, dk), (RC, dv), (RC, dv) */
	double beta[RC], G[RC], Ga[RC], e[RC];
	double KK[RC * RC], E[RC * RC], A[RC * RC], P[RC * RC], T[RC * RC];
};

static struct rchunk *rchunk_new(int dk, int dv)
{
	struct rchunk *c = calloc(1, sizeof(*c));

	c->dk = dk;
	c->dv = dv;
	c->K = calloc((size_t)RC * dk, sizeof(double));
	c->Q = calloc((size_t)RC * dk, sizeof(double));
	c->V = calloc((size_t)RC * dv, sizeof(double));
	c->dO = calloc((size_t)RC * dv, sizeof(double));
	return c;
}

static void rchunk_free(struct rchunk *c)
{
	free(c->K), free(c->Q), free(c->V), free(c->dO), free(c);
}

/* load chunk ch of (record b, value head h), masked past len; then G, Ga, e, KK, E, A, P, T */
static void rchunk_local(struct rchunk *c, const double *q, const double *k, const double *v,
			 int vs, const double *beta, const double *g, const double *dout, int b,
			 int h, int ch, int L, int len, int nk, int nv)
{
	int dk = c->dk, dv = c->dv, kh = h / (nv / nk);

	for (int r = 0; r < RC; r++) {
		int p = ch * RC + r;
		size_t t = (size_t)b * L + p;
		int ok = p < len;

		for (int i = 0; i < dk; i++) {
			c->K[r * dk + i] = ok ? k[t * nk * dk + (size_t)kh * dk + i] : 0;
			c->Q[r * dk + i] = ok ? q[t * nk * dk + (size_t)kh * dk + i] : 0;
		}
		for (int j = 0; j < dv; j++) {
			c->V[r * dv + j] = ok ? v[t * vs + (size_t)h * dv + j] : 0;
			c->dO[r * dv + j] = ok && dout ? dout[t * nv * dv + (size_t)h * dv + j] : 0;
		}
		c->beta[r] = ok ? beta[t * nv + h] : 0;
		c->G[r] = (ok ? g[t * nv + h] : 0) + (r ? c->G[r - 1] : 0);
	}
	for (int r = 0; r < RC; r++) {
		c->Ga[r] = exp(c->G[r]);
		c->e[r] = exp(c->G[RC - 1] - c->G[r]);
	}
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < RC; s++) {
			double kk = 0, qk = 0;

			for (int i = 0; i < dk; i++) {
				kk += c->K[r * dk + i] * c->K[s * dk + i];
				qk += c->Q[r * dk + i] * c->K[s * dk + i];
			}
			c->KK[r * RC + s] = kk;
			c->E[r * RC + s] = s <= r ? exp(c->G[r] - c->G[s]) : 0;
			c->A[r * RC + s] = s < r ? c->beta[r] * c->E[r * RC + s] * kk : 0;
			c->P[r * RC + s] = s <= r ? c->E[r * RC + s] * qk : 0;
		}
	/* T = (I + A)^-1 by forward substitution, column by column (columns are independent) */
	for (int j = 0; j < RC; j++)
		for (int r = 0; r < RC; r++) {
			double a = r == j;

			for (int s = j; s < r; s++)
				a -= c->A[r * RC + s] * c->T[s * RC + j];
			c->T[r * RC + j] = r < j ? 0 : a;
		}
}

/* delta(RC, dv) = T diag(beta) (V - diag(Ga) K S0) */
static void rchunk_delta(const struct rchunk *c, const double *S0, double *delta)
{
	int dk = c->dk, dv = c->dv;
	double *R = malloc((size_t)RC * dv * sizeof(double));

	for (int r = 0; r < RC; r++)
		for (int j = 0; j < dv; j++) {
			double a = 0;

			for (int i = 0; i < dk; i++)
				a += c->K[r * dk + i] * S0[(size_t)i * dv + j];
			R[r * dv + j] = c->beta[r] * (c->V[r * dv + j] - c->Ga[r] * a);
		}
	for (int r = 0; r < RC; r++)
		for (int j = 0; j < dv; j++) {
			double a = 0;

			for (int s = 0; s <= r; s++)
				a += c->T[r * RC + s] * R[s * dv + j];
			delta[r * dv + j] = a;
		}
	free(R);
}

static void ref_fwd(double *o, double *states, const double *q, const double *k, const double *v,
		    int vs, const double *beta, const double *g, const int32_t *lens, int B,
		    int L, int nk, int nv, int dk, int dv)
{
	int nch = (L + RC - 1) / RC;
	size_t SS = (size_t)dk * dv;
	struct rchunk *c = rchunk_new(dk, dv);
	double *S = malloc(SS * sizeof(double)), *Sn = malloc(SS * sizeof(double));
	double *delta = malloc((size_t)RC * dv * sizeof(double));

	for (int b = 0; b < B; b++)
		for (int h = 0; h < nv; h++) {
			memset(S, 0, SS * sizeof(double));
			for (int ch = 0; ch < nch; ch++) {
				memcpy(states + (((size_t)b * nch + ch) * nv + h) * SS, S,
				       SS * sizeof(double));
				rchunk_local(c, q, k, v, vs, beta, g, NULL, b, h, ch, L, lens[b],
					     nk, nv);
				rchunk_delta(c, S, delta);
				for (int r = 0; r < RC && ch * RC + r < L; r++) {
					size_t t = (size_t)b * L + ch * RC + r;

					for (int j = 0; j < dv; j++) {
						double a = 0;

						for (int i = 0; i < dk; i++)
							a += c->Q[r * dk + i] *
							     S[(size_t)i * dv + j];
						a *= c->Ga[r];
						for (int s = 0; s <= r; s++)
							a += c->P[r * RC + s] * delta[s * dv + j];
						o[t * nv * dv + (size_t)h * dv + j] = a;
					}
				}
				for (int i = 0; i < dk; i++)
					for (int j = 0; j < dv; j++) {
						double a = c->Ga[RC - 1] * S[(size_t)i * dv + j];

						for (int s = 0; s < RC; s++)
							a += c->K[s * dk + i] * c->e[s] *
							     delta[s * dv + j];
						Sn[(size_t)i * dv + j] = a;
					}
				memcpy(S, Sn, SS * sizeof(double));
			}
		}
	free(S), free(Sn), free(delta);
	rchunk_free(c);
}

/* dst(B, nch, nv, dk, dv): the gradient of the state at the END of every chunk (0 past len) */
static void ref_bwd_states(double *dst, const double *dout, const double *q, const double *k,
			   const double *v, int vs, const double *beta, const double *g,
			   const int32_t *lens, int B, int L, int nk, int nv, int dk, int dv)
{
	int nch = (L + RC - 1) / RC;
	size_t SS = (size_t)dk * dv;
	struct rchunk *c = rchunk_new(dk, dv);
	double *dS = malloc(SS * sizeof(double)), *dS0 = malloc(SS * sizeof(double));
	double *dd = malloc((size_t)RC * dv * sizeof(double));
	double *Y = malloc((size_t)RC * dv * sizeof(double));

	for (int b = 0; b < B; b++)
		for (int h = 0; h < nv; h++) {
			int last = lens[b] ? (lens[b] - 1) / RC : -1;

			memset(dS, 0, SS * sizeof(double));
			for (int ch = nch - 1; ch >= 0; ch--) {
				memcpy(dst + (((size_t)b * nch + ch) * nv + h) * SS, dS,
				       SS * sizeof(double));
				if (ch > last)
					continue;
				rchunk_local(c, q, k, v, vs, beta, g, dout, b, h, ch, L, lens[b],
					     nk, nv);
				/* ddelta = P^T dO + diag(e) K dS */
				for (int s = 0; s < RC; s++)
					for (int j = 0; j < dv; j++) {
						double a = 0, kd = 0;

						for (int r = s; r < RC; r++)
							a += c->P[r * RC + s] * c->dO[r * dv + j];
						for (int i = 0; i < dk; i++)
							kd += c->K[s * dk + i] *
							      dS[(size_t)i * dv + j];
						dd[s * dv + j] = a + c->e[s] * kd;
					}
				/* Y = diag(beta Ga) T^T ddelta */
				for (int s = 0; s < RC; s++)
					for (int j = 0; j < dv; j++) {
						double a = 0;

						for (int r = s; r < RC; r++)
							a += c->T[r * RC + s] * dd[r * dv + j];
						Y[s * dv + j] = c->beta[s] * c->Ga[s] * a;
					}
				/* dS0 = Q^T diag(Ga) dO + Ga_end dS - K^T Y */
				for (int i = 0; i < dk; i++)
					for (int j = 0; j < dv; j++) {
						double a = c->Ga[RC - 1] * dS[(size_t)i * dv + j];

						for (int r = 0; r < RC; r++)
							a += c->Q[r * dk + i] * c->Ga[r] *
							     c->dO[r * dv + j] -
							     c->K[r * dk + i] * Y[r * dv + j];
						dS0[(size_t)i * dv + j] = a;
					}
				memcpy(dS, dS0, SS * sizeof(double));
			}
		}
	free(dS), free(dS0), free(dd), free(Y);
	rchunk_free(c);
}

/*
 * One value head's share of chunk ch (loaded in c, its start state S0 and end dS): dval, dbeta,
 * dg written, dQ and dK (RC, dk) added to
 */
static void rchunk_grads(struct rchunk *c, const double *S0, const double *dS, double *dQ,
			 double *dK, double *dval, double *dbeta, double *dg, int b, int h, int ch,
			 int L, int len, int nv, int vs)
{
	int dk = c->dk, dv = c->dv;
	size_t SS = (size_t)dk * dv, CK = (size_t)RC * dk, CV = (size_t)RC * dv;
	double *delta = malloc(CV * sizeof(double)), *dd = malloc(CV * sizeof(double));
	double *Z = malloc(CK * sizeof(double)), *Y = malloc(CK * sizeof(double));
	double *dW = malloc(CK * sizeof(double)), *dXw = malloc(CK * sizeof(double));
	double *dXu = malloc(CV * sizeof(double));
	double dP[RC * RC], dT[RC * RC], M[RC * RC], dA[RC * RC], dG[RC];

	rchunk_delta(c, S0, delta);
	memset(dG, 0, sizeof(dG));
	/* ddelta = P^T dO + diag(e) K dS */
	for (int s = 0; s < RC; s++)
		for (int j = 0; j < dv; j++) {
			double a = 0, kd = 0;

			for (int r = s; r < RC; r++)
				a += c->P[r * RC + s] * c->dO[r * dv + j];
			for (int i = 0; i < dk; i++)
				kd += c->K[s * dk + i] * dS[(size_t)i * dv + j];
			dd[s * dv + j] = a + c->e[s] * kd;
		}
	/* Z = dO S0^T, Y = delta dS^T, dW = -ddelta S0^T (RC x dk) */
	for (int r = 0; r < RC; r++)
		for (int i = 0; i < dk; i++) {
			double z = 0, y = 0, w = 0;

			for (int j = 0; j < dv; j++) {
				z += c->dO[r * dv + j] * S0[(size_t)i * dv + j];
				y += delta[r * dv + j] * dS[(size_t)i * dv + j];
				w += dd[r * dv + j] * S0[(size_t)i * dv + j];
			}
			Z[r * dk + i] = z;
			Y[r * dk + i] = y;
			dW[r * dk + i] = -w;
		}
	/* dP = dO delta^T (s <= r); M = dP o E */
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < RC; s++) {
			double a = 0;

			for (int j = 0; j < dv && s <= r; j++)
				a += c->dO[r * dv + j] * delta[s * dv + j];
			dP[r * RC + s] = a;
			M[r * RC + s] = a * c->E[r * RC + s];
		}
	/* through O: dQ += diag(Ga) Z + M K, dK += M^T Q; dG */
	for (int r = 0; r < RC; r++) {
		double zq = 0;

		for (int i = 0; i < dk; i++)
			zq += Z[r * dk + i] * c->Q[r * dk + i];
		dG[r] += c->Ga[r] * zq;
		for (int s = 0; s < RC; s++) {
			double pe = dP[r * RC + s] * c->P[r * RC + s];

			dG[r] += pe;
			dG[s] -= pe;
		}
	}
	for (int r = 0; r < RC; r++)
		for (int i = 0; i < dk; i++) {
			double a = c->Ga[r] * Z[r * dk + i], bb = 0;

			for (int s = 0; s < RC; s++) {
				a += M[r * RC + s] * c->K[s * dk + i];
				bb += M[s * RC + r] * c->Q[s * dk + i];
			}
			dQ[r * dk + i] += a;
			dK[r * dk + i] += bb;
		}
	/* through S_end: dK += diag(e) Y; dG */
	{
		double sd = 0;

		for (size_t x = 0; x < SS; x++)
			sd += S0[x] * dS[x];
		dG[RC - 1] += c->Ga[RC - 1] * sd;
	}
	for (int s = 0; s < RC; s++) {
		double de = 0;

		for (int i = 0; i < dk; i++) {
			de += c->K[s * dk + i] * Y[s * dk + i];
			dK[s * dk + i] += c->e[s] * Y[s * dk + i];
		}
		dG[RC - 1] += de * c->e[s];
		dG[s] -= de * c->e[s];
	}
	/* through U = T diag(beta) V, W = T diag(beta Ga) K:
	 * dXu = T^T ddelta, dXw = T^T dW */
	for (int s = 0; s < RC; s++) {
		for (int j = 0; j < dv; j++) {
			double a = 0;

			for (int r = s; r < RC; r++)
				a += c->T[r * RC + s] * dd[r * dv + j];
			dXu[s * dv + j] = a;
		}
		for (int i = 0; i < dk; i++) {
			double a = 0;

			for (int r = s; r < RC; r++)
				a += c->T[r * RC + s] * dW[r * dk + i];
			dXw[s * dk + i] = a;
		}
	}
	double db[RC];

	for (int r = 0; r < RC; r++) {
		double xv = 0, xk = 0;

		for (int j = 0; j < dv; j++)
			xv += dXu[r * dv + j] * c->V[r * dv + j];
		for (int i = 0; i < dk; i++) {
			xk += dXw[r * dk + i] * c->K[r * dk + i];
			dK[r * dk + i] += c->beta[r] * c->Ga[r] *
					  dXw[r * dk + i];
		}
		db[r] = xv + c->Ga[r] * xk;
		dG[r] += c->beta[r] * c->Ga[r] * xk;
	}
	/* dT = ddelta (diag(beta) V)^T + dW (diag(beta Ga) K)^T (s <= r) */
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < RC; s++) {
			double a = 0, w = 0;

			for (int j = 0; j < dv && s <= r; j++)
				a += dd[r * dv + j] * c->V[s * dv + j];
			for (int i = 0; i < dk && s <= r; i++)
				w += dW[r * dk + i] * c->K[s * dk + i];
			dT[r * RC + s] = c->beta[s] * (a + c->Ga[s] * w);
		}
	/* dA = -T^T dT T^T (s < r): M = dT T^T, dA = -T^T M */
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < RC; s++) {
			double a = 0;

			for (int x = 0; x < RC; x++)
				a += dT[r * RC + x] * c->T[s * RC + x];
			M[r * RC + s] = a;
		}
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < RC; s++) {
			double a = 0;

			for (int x = 0; x < RC && s < r; x++)
				a -= c->T[x * RC + r] * M[x * RC + s];
			dA[r * RC + s] = a;
		}
	/* through A_rs = beta_r E_rs k_r.k_s: dbeta, dG, dK += D K + D^T K */
	for (int r = 0; r < RC; r++)
		for (int s = 0; s < r; s++) {
			double ae = dA[r * RC + s] * c->A[r * RC + s];

			db[r] += dA[r * RC + s] * c->E[r * RC + s] *
				 c->KK[r * RC + s];
			dG[r] += ae;
			dG[s] -= ae;
		}
	for (int r = 0; r < RC; r++)
		for (int i = 0; i < dk; i++) {
			double a = 0;

			for (int s = 0; s < RC; s++) {
				double d1 = s < r ? dA[r * RC + s] * c->beta[r] *
						    c->E[r * RC + s] : 0;
				double d2 = r < s ? dA[s * RC + r] * c->beta[s] *
						    c->E[s * RC + r] : 0;

				a += (d1 + d2) * c->K[s * dk + i];
			}
			dK[r * dk + i] += a;
		}
	/* the outputs of this value head: dv, dbeta, dg (reverse cumsum) */
	double acc = 0;

	for (int r = RC - 1; r >= 0; r--) {
		int p = ch * RC + r;
		size_t t = (size_t)b * L + p;
		int ok = p < len;

		acc += dG[r];
		if (p >= L)
			continue;
		for (int j = 0; j < dv; j++)
			dval[t * vs + (size_t)h * dv + j] =
				ok ? c->beta[r] * dXu[r * dv + j] : 0;
		dbeta[t * nv + h] = ok ? db[r] : 0;
		dg[t * nv + h] = ok ? acc : 0;
	}
	free(delta), free(dd), free(Z), free(Y), free(dW), free(dXw), free(dXu);
}

/* every gradient, from the chunk-start states and the chunk-end dS (dst) */
static void ref_bwd_grads(double *dq, double *dk_, double *dval, double *dbeta, double *dg,
			  const double *dout, const double *states, const double *dst,
			  const double *q, const double *k, const double *v, int vs,
			  const double *beta, const double *g, const int32_t *lens, int B, int L,
			  int nk, int nv, int dk, int dv)
{
	int nch = (L + RC - 1) / RC, grp = nv / nk;
	size_t SS = (size_t)dk * dv, CK = (size_t)RC * dk;
	struct rchunk *c = rchunk_new(dk, dv);
	double *dQ = malloc(CK * sizeof(double)), *dK = malloc(CK * sizeof(double));

	for (int b = 0; b < B; b++)
		for (int kh = 0; kh < nk; kh++)
			for (int ch = 0; ch < nch; ch++) {
				memset(dQ, 0, CK * sizeof(double));
				memset(dK, 0, CK * sizeof(double));
				for (int h = kh * grp; h < (kh + 1) * grp; h++) {
					size_t so = (((size_t)b * nch + ch) * nv + h) * SS;

					rchunk_local(c, q, k, v, vs, beta, g, dout, b, h, ch, L,
						     lens[b], nk, nv);
					rchunk_grads(c, states + so, dst + so, dQ, dK, dval, dbeta,
						     dg, b, h, ch, L, lens[b], nv, vs);
				}
				for (int r = 0; r < RC && ch * RC + r < L; r++) {
					size_t t = (size_t)b * L + ch * RC + r;
					size_t o = t * nk * dk + (size_t)kh * dk;
					int ok = ch * RC + r < lens[b];

					for (int i = 0; i < dk; i++) {
						dq[o + i] = ok ? dQ[r * dk + i] : 0;
						dk_[o + i] = ok ? dK[r * dk + i] : 0;
					}
				}
			}
	free(dQ), free(dK);
	rchunk_free(c);
}