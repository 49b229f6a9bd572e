/*
 * test_cp_ops: the context-parallel attention ops (backend.h: copy_cols, cp_attention_fwd/_bwd)
 * against the whole-row attention ops, which have their own tests against finite differences
 * and transformers.  Rows are cut into 2C chunks, rank r of C simulated ranks holding chunks r
 * and 2C-1-r; every rank's outputs must equal the whole-row op's rows of its tokens (also when
 * split into the rank's own keys, the others' poisoned, then the others' merged in), and the
 * k/v gradient shares of the ranks must add up to the whole-row op's k/v gradients.  One
 * document per row and packed rows (pos), rows with padding, grouped-query heads; double
 * compute elements so that only the order of sums can differ.
 */
#include <stdint.h>

#include "backend.h"
#include "testutil.h"

enum { B = 2, L = 48, C = 3, NH = 4, NKV = 2, HD = 8 };
#define W ((NH + 2 * NKV) * HD)
#define KW (2 * NKV * HD)
#define LC (L / C)
#define CH (L / (2 * C))

static double rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return ((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* the row index of local token il of rank r */
static int gidx_of(int r, int il)
{
	return il < CH ? r * CH + il : (2 * C - 1 - r) * CH + il - CH;
}

static void run(struct sl_backend *be, bool packed)
{
	static const int32_t lens[B] = { 48, 31 };
	int32_t pos[B * L], lpos[B * LC], lgidx[B * LC];
	double *qkv = be->alloc(be, sizeof(double) * B * L * W);
	double *out = be->alloc(be, sizeof(double) * B * L * NH * HD);
	double *lse = be->alloc(be, sizeof(double) * B * L * NH);
	double *dout = be->alloc(be, sizeof(double) * B * L * NH * HD);
	double *dqkv = be->alloc(be, sizeof(double) * B * L * W);
	double *kv = be->alloc(be, sizeof(double) * B * L * KW);
	double *dkv_sum = be->alloc(be, sizeof(double) * B * L * KW);
	double *dkv = be->alloc(be, sizeof(double) * B * L * KW);
	double *lq = be->alloc(be, sizeof(double) * B * LC * W);
	double *lo = be->alloc(be, sizeof(double) * B * LC * NH * HD);
	double *ll = be->alloc(be, sizeof(double) * B * LC * NH);
	double *ldo = be->alloc(be, sizeof(double) * B * LC * NH * HD);
	double *ldq = be->alloc(be, sizeof(double) * B * LC * W);
	double *kvp = be->alloc(be, sizeof(double) * B * L * KW);
	double *po = be->alloc(be, sizeof(double) * B * LC * NH * HD);
	double *pl = be->alloc(be, sizeof(double) * B * LC * NH);
	unsigned s = packed ? 7 : 3;
	double worst = 0;

	for (size_t i = 0; i < (size_t)B * L * W; i++)
		qkv[i] = rnd(&s);
	for (size_t i = 0; i < (size_t)B * L * NH * HD; i++)
		dout[i] = rnd(&s);
	/* packed: row 0 holds documents of 20 and 28 tokens, row 1 of 10 and 21 */
	for (int b = 0; b < B; b++)
		for (int i = 0; i < L; i++) {
			int split = b ? 10 : 20;

			pos[b * L + i] = i < lens[b] ? (i < split ? i : i - split) : 0;
		}
	be->attention_fwd(be, out, lse, qkv, lens, packed ? pos : NULL, B, L, NH, NKV, HD);
	be->attention_bwd(be, dqkv, dout, out, lse, qkv, lens, packed ? pos : NULL, B, L, NH,
			  NKV, HD);
	/* kv = the k|v columns; copy_cols checked on the way */
	be->copy_cols(be, kv, KW, 0, qkv, W, NH * HD, B * L, KW, false);
	for (int t = 0; t < B * L; t++)
		for (int i = 0; i < KW; i++)
			CHECK(kv[t * KW + i] == qkv[t * W + NH * HD + i], "copy_cols");
	memset(dkv_sum, 0, sizeof(double) * B * L * KW);

	for (int r = 0; r < C; r++) {
		for (int b = 0; b < B; b++)
			for (int il = 0; il < LC; il++) {
				int g = gidx_of(r, il), t = b * LC + il;

				lgidx[t] = g;
				lpos[t] = g >= lens[b] ? 0 : packed ? pos[b * L + g] : g;
				memcpy(lq + (size_t)t * W, qkv + (size_t)(b * L + g) * W,
				       sizeof(double) * W);
				memcpy(ldo + (size_t)t * NH * HD, dout + (size_t)(b * L + g) * NH * HD,
				       sizeof(double) * NH * HD);
			}
		be->cp_attention_fwd(be, lo, ll, lq, kv, lgidx, lpos, lens, B, LC, L, NH, NKV, HD, r,
				     C, 0);
		/*
		 * split by key owner: part 1 on rank r's keys alone (every other key NaN: read,
		 * it would poison the output), part 2 merges the others': part 0's result
		 */
		for (int b = 0; b < B; b++)
			for (int j = 0; j < L; j++) {
				int c = j / CH, owner = c < C ? c : 2 * C - 1 - c;

				for (int i = 0; i < KW; i++)
					kvp[(b * L + j) * KW + i] = owner == r ? kv[(b * L + j) * KW + i]
								      : NAN;
			}
		be->cp_attention_fwd(be, po, pl, lq, kvp, lgidx, lpos, lens, B, LC, L, NH, NKV, HD, r,
				     C, 1);
		be->cp_attention_fwd(be, po, pl, lq, kv, lgidx, lpos, lens, B, LC, L, NH, NKV, HD, r,
				     C, 2);
		for (size_t i = 0; i < (size_t)B * LC * NH * HD; i++)
			CHECK(fabs(po[i] - lo[i]) < 1e-12, "split forward r %d: out %zu %g vs %g", r,
			      i, po[i], lo[i]);
		for (size_t i = 0; i < (size_t)B * LC * NH; i++)
			CHECK(fabs(pl[i] - ll[i]) < 1e-12, "split forward r %d: lse %zu", r, i);
		be->cp_attention_bwd(be, ldq, dkv, ldo, lo, ll, lq, kv, lgidx, lpos, lens, B, LC, L,
				     NH, NKV, HD);
		for (int b = 0; b < B; b++)
			for (int il = 0; il < LC; il++) {
				int g = lgidx[b * LC + il], t = b * LC + il;

				for (int i = 0; i < NH * HD; i++) {
					double d = fabs(lo[t * NH * HD + i] -
							out[(b * L + g) * NH * HD + i]);

					worst = fmax(worst, d);
					CHECK(d < 1e-12, "out r %d b %d g %d", r, b, g);
					d = fabs(ldq[t * W + i] - dqkv[(b * L + g) * W + i]);
					CHECK(d < 1e-12, "dq r %d b %d g %d", r, b, g);
				}
				for (int h = 0; h < NH; h++)
					CHECK(fabs(ll[t * NH + h] - lse[(b * L + g) * NH + h]) <
					      1e-12, "lse r %d b %d g %d", r, b, g);
				for (int i = NH * HD; i < W; i++)
					CHECK(ldq[t * W + i] == 0, "k|v columns of dqkv not zero");
			}
		be->add(be, dkv_sum, dkv, (size_t)B * L * KW);
	}
	for (int t = 0; t < B * L; t++)
		for (int i = 0; i < KW; i++) {
			double d = fabs(dkv_sum[t * KW + i] - dqkv[t * W + NH * HD + i]);

			worst = fmax(worst, d);
			CHECK(d < 1e-12, "dkv token %d col %d: %g vs %g", t, i, dkv_sum[t * KW + i],
			      dqkv[t * W + NH * HD + i]);
		}
	printf("%s rows: worst difference %.2e\n", packed ? "packed" : "unpacked", worst);
	be->free(be, qkv); be->free(be, out); be->free(be, lse); be->free(be, dout);
	be->free(be, dqkv); be->free(be, kv); be->free(be, dkv_sum); be->free(be, dkv);
	be->free(be, lq); be->free(be, lo); be->free(be, ll); be->free(be, ldo); be->free(be, ldq);
	be->free(be, kvp); be->free(be, po); be->free(be, pl);
}

int main(void)
{
	struct sl_backend *be = sl_backend_cpu64_create();

	CHECK(be && be->cp_attention_fwd && be->cp_attention_bwd && be->copy_cols,
	      "the cpu64 backend has the context-parallel ops");
	if (!be || !be->cp_attention_fwd)
		return test_exit("test_cp_ops");
	run(be, false);
	run(be, true);
	be->destroy(be);
	return test_exit("test_cp_ops");
}
