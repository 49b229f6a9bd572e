/*
 * test_plan: the memory planner (src/plan.c).
 *
 * 1. The 27B dense shape (test/fixtures/plan/qwen3-27b/config.json: hidden 5120, 64 layers, 40
 *    heads, 8 KV heads, head_dim 128, intermediate 21504, vocab 151936), batch 1 x 2048 tokens,
 *    backend cuda (bf16 compute, float stats, 256-byte arena blocks): every category's bytes and
 *    every verdict against the hand calculation written out below, for 1 x 80 GB with no offload,
 *    optimizer offload with and without activation checkpointing, params offload; 1 x 141 GB
 *    with optimizer offload; 8 x 80 GB FSDP.  The table in README.md ("Will it fit?") is these.
 * 2. The planner counts what the code allocates: on a small model with the cpu backend, the
 *    bytes sl_shard_create + sl_model_create + the trainer's device batch take from a counting
 *    backend equal the plan's device total, and the host bytes shard.c takes for offload equal
 *    the plan's offloaded host state, for every offload mode, with and without checkpointing.
 */
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "model.h"
#include "plan.h"
#include "shard.h"
#include "testutil.h"

#define GB 1000000000.0

/* ---- 1. the 27B shape by hand ------------------------------------------------------------ */

/*
 * Parameters (elements), from the layout of src/model.c (every tensor offset a multiple of 16
 * elements; all these sizes already are):
 *   embedding unit   V*H = 151936*5120                                   =    777,912,320
 *   one layer        input_layernorm H                                   =          5,120
 *                    q,k,v proj (40+2*8)*128 x 5120 = 7168*5120          =     36,700,160
 *                    o_proj 5120 x 40*128                                =     26,214,400
 *                    q_norm, k_norm 128 + 128                            =            256
 *                    post_attention_layernorm H                          =          5,120
 *                    gate+up 2*21504 x 5120                              =    220,200,960
 *                    down 5120 x 21504                                   =    110,100,480
 *                    layer total                                         =    393,226,496
 *   head unit        norm H + score 1 x H                                =         10,240
 *   P = 777,912,320 + 64 * 393,226,496 + 10,240                          = 25,944,418,304
 */
#define EMB 777912320ull
#define LAYER 393226496ull
#define HEAD 10240ull
#define NL 64ull
#define P_ALL (EMB + NL * LAYER + HEAD)

/* the cuda arena hands out multiples of 256 bytes */
static unsigned long long r256(unsigned long long b)
{
	return (b + 255) / 256 * 256;
}

/* sum over units of r256(shard * bytes): shard = ceil(unit / S) */
static unsigned long long units(unsigned long long S, unsigned long long bytes)
{
	return r256((EMB + S - 1) / S * bytes) + NL * r256((LAYER + S - 1) / S * bytes) +
		r256((HEAD + S - 1) / S * bytes);
}

/*
 * Activations at T = 2048 tokens, bf16 (2 bytes), stats float (4 bytes); every size below is a
 * multiple of 256 bytes.  Per layer kept for the backward (struct acts of model.c):
 *   xn1, h, xn2    3 x T*H*2        = 3 x 20,971,520  =  62,914,560
 *   qkv, qkvr      2 x T*7168*2     = 2 x 29,360,128  =  58,720,256
 *   att            T*5120*2                           =  20,971,520
 *   gu             T*2*21504*2                        = 176,160,768
 *   act            T*21504*2                          =  88,080,384
 *   rstd1, rstd2   2 x T*4                            =      16,384
 *   rstd_qk        T*(40+8)*4                         =     393,216
 *   lse            T*40*4                             =     327,680
 *   one layer's set                                   = 407,584,768
 * always: x (65 layer inputs + final) 65 x 20,971,520 = 1,363,148,800; gx, gn 2 x 20,971,520;
 * gb1 T*max(2I, Q)*2 = 176,160,768; gb2 T*max(I, Q, 5120)*2 = 88,080,384:
 *   fixed = 1,363,148,800 + 41,943,040 + 176,160,768 + 88,080,384 = 1,669,332,992
 *   without checkpointing: fixed + 64 x 407,584,768 = 27,754,758,144
 *   with checkpointing:    fixed +  1 x 407,584,768 =  2,076,917,760
 */
#define ACT_LAYER 407584768ull
#define ACT_FIXED 1669332992ull
/*
 * Head/loss + batch (B = 1): xl, xnf, gxnf, gxl 4 x 10,240; rstdf, logits, dlogits, loss,
 * scores, lens, last, labels 8 x 256 (each rounded up); ids T*4 = 8,192:  51,200
 */
#define HEADBUF 51200ull
/* cuBLASLt workspace 32 MiB + reduction scratch 64 MiB; CUDA context estimate 600 MiB */
#define WS (96ull << 20)
#define CTX (600ull << 20)
/* the largest unit is the embedding: bf16 777,912,320 x 2 = 1,555,824,640 bytes */
#define MAXU2 (EMB * 2)

struct want {
	const char *what;
	int gpus;
	double gpu_gb;
	int offload;
	bool ckpt;
	unsigned long long w, g, o, a, c;	/* weights, grads, master+moments, acts, comm */
	bool fits;
};

static void check_27b(void)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	/*
	 * S = 1, no offload: weights = bf16 shard of every unit = 2P = 51,888,836,608 (the model
	 * reads its own shard in place: no gather slots); gradients = 2 unit slots of the largest
	 * unit 2 x 1,555,824,640 + fp32 accumulators 4P = 3,111,649,280 + 103,777,673,216;
	 * master + m + v = 12P = 311,333,019,648; comm = rs_out (largest shard, fp32) 3,111,649,280
	 * + sumsq 256.
	 * S = 1, offload optimizer: the same minus the fp32 state (grads = the 2 slots only: with
	 * the default accum 2 the fp32 accumulators of earlier micro-batches, 4P = 96.6 GiB, do not
	 * fit beside the rest, so they add up on the host); comm adds offload's gradient staging
	 * ring, 2 fp32 shards of the largest unit = 2 x 3,111,649,280.
	 * S = 1, offload params: weights = 3 gathered units in flight (prefetch 1 + 2) x
	 * 1,555,824,640 = 4,667,473,920; comm as with offload optimizer (uploads go straight into
	 * the slots).
	 * Host, offload: master + m + v 12P, grad32 4P plus the ring's host half (accumulating on
	 * the host) 2 x 3,111,649,280, the bf16 copy AdamW writes 2P.
	 * S = 8: shards of ceil(unit/8) (each buffer rounded to 256 bytes); weights = bf16 shards +
	 * 3 gather slots; grads = 2 slots + fp32 shards; master+moments = 3 fp32 shards; comm =
	 * fp32 reduce-scatter input of the largest unit 4 x 777,912,320 + its fp32 shard
	 * 4 x 97,239,040 + 256.
	 */
	const unsigned long long comm1 = EMB * 4 + 256, comm8 = EMB * 4 + EMB / 8 * 4 + 256;
	const unsigned long long ring = 2 * EMB * 4;
	const struct want wants[] = {
		{ "1 x 80 GB, no offload", 1, 80, SL_OFFLOAD_NONE, false,
		  2 * P_ALL, 2 * MAXU2 + 4 * P_ALL, 12 * P_ALL, ACT_FIXED + NL * ACT_LAYER, comm1,
		  false },
		{ "1 x 80 GB, offload optimizer", 1, 80, SL_OFFLOAD_OPTIMIZER, false,
		  2 * P_ALL, 2 * MAXU2, 0, ACT_FIXED + NL * ACT_LAYER, comm1 + ring, false },
		{ "1 x 80 GB, offload optimizer + checkpointing", 1, 80, SL_OFFLOAD_OPTIMIZER, true,
		  2 * P_ALL, 2 * MAXU2, 0, ACT_FIXED + ACT_LAYER, comm1 + ring, true },
		{ "1 x 80 GB, offload params", 1, 80, SL_OFFLOAD_PARAMS, false,
		  3 * MAXU2, 2 * MAXU2, 0, ACT_FIXED + NL * ACT_LAYER, comm1 + ring, true },
		{ "1 x 141 GB, offload optimizer", 1, 141, SL_OFFLOAD_OPTIMIZER, false,
		  2 * P_ALL, 2 * MAXU2, 0, ACT_FIXED + NL * ACT_LAYER, comm1 + ring, true },
		{ "8 x 80 GB FSDP", 8, 80, SL_OFFLOAD_NONE, false,
		  units(8, 2) + 3 * MAXU2, 2 * MAXU2 + units(8, 4), 3 * units(8, 4),
		  ACT_FIXED + NL * ACT_LAYER, comm8, false },
	};
	char path[4096];
	const char *src = getenv("top_srcdir");

	snprintf(path, sizeof(path), "%s/test/fixtures/plan/qwen3-27b/config.json",
		 src ? src : "..");
	CHECK(sl_model_config_load(&mc, path) == 0, "%s", path);
	CHECK(sl_model_layout(&mc, 0, &lay) == 0);
	CHECK(lay.total_numel == P_ALL, "P %zu", lay.total_numel);
	/* P = 25,944,418,304 written out, against the expression above */
	CHECK(P_ALL == 25944418304ull);
	CHECK(ACT_FIXED + NL * ACT_LAYER == 27754758144ull);
	CHECK(ACT_FIXED + ACT_LAYER == 2076917760ull);

	for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++) {
		const struct want *w = &wants[i];
		struct sl_config c;
		struct sl_plan_opts o = { .gpus = w->gpus, .gpu_mem = w->gpu_gb * GB,
					  .offload = -1, .ckpt = -1 };
		struct sl_plan p;
		unsigned long long total = w->w + w->g + w->o + w->a + w->c + HEADBUF + WS + CTX;

		sl_config_defaults(&c);
		snprintf(c.source, sizeof(c.source), "27b");
		c.backend = SL_BACKEND_CUDA;
		c.train.batch = 1;
		c.data.max_state = 2048;
		c.parallel.offload = w->offload;
		c.train.activation_checkpointing = w->ckpt;
		CHECK(sl_plan_compute(&c, &mc, &lay, &o, &p) == 0);
		CHECK(p.dev[SL_PLAN_WEIGHTS] == w->w, "%s: weights %zu, want %llu", w->what,
		      p.dev[SL_PLAN_WEIGHTS], w->w);
		CHECK(p.dev[SL_PLAN_GRADS] == w->g, "%s: grads %zu, want %llu", w->what,
		      p.dev[SL_PLAN_GRADS], w->g);
		CHECK(p.dev[SL_PLAN_OPTIM] == w->o, "%s: optim %zu, want %llu", w->what,
		      p.dev[SL_PLAN_OPTIM], w->o);
		CHECK(p.dev[SL_PLAN_ACTS] == w->a, "%s: acts %zu, want %llu", w->what,
		      p.dev[SL_PLAN_ACTS], w->a);
		CHECK(p.dev[SL_PLAN_COMM] == w->c, "%s: comm %zu, want %llu", w->what,
		      p.dev[SL_PLAN_COMM], w->c);
		CHECK(p.dev[SL_PLAN_HEAD] == HEADBUF, "%s: head %zu", w->what, p.dev[SL_PLAN_HEAD]);
		CHECK(p.dev_total == total, "%s: total %zu, want %llu", w->what, p.dev_total,
		      total);
		CHECK(p.gpu_fits == w->fits, "%s: verdict %d, want %d (%.2f GiB of %.2f GiB)",
		      w->what, p.gpu_fits, w->fits, p.dev_total / 1073741824.0,
		      w->gpu_gb * GB / 1073741824.0);
		/* host: fp32 master + m + v (12P), accumulators 4P + the ring's host half, bf16 2P */
		if (w->offload != SL_OFFLOAD_NONE) {
			CHECK(!p.accum_dev, "%s: accumulation should not fit the GPU", w->what);
			CHECK(p.host[SL_PLAN_OPTIM] == 12 * P_ALL, "%s", w->what);
			CHECK(p.host[SL_PLAN_GRADS] == 4 * P_ALL + 2 * EMB * 4, "%s", w->what);
		}
		CHECK(p.host[SL_PLAN_WEIGHTS] == (w->offload != SL_OFFLOAD_NONE ? 2 * P_ALL : 0),
		      "%s", w->what);
		printf("%-46s %8.2f GiB  %s\n", w->what, p.dev_total / 1073741824.0,
		       p.gpu_fits ? "fits" : "does not fit");
	}
	sl_layout_free(&lay);
	sl_model_config_free(&mc);
}

/* ---- 2. the plan counts what the code allocates ------------------------------------------ */

struct counting {
	struct sl_backend be;		/* first: the ops see this table */
	struct sl_backend *cpu;
	size_t dev, host;		/* bytes in use, rounded as the cpu allocator does */
};

static size_t r64(size_t b)
{
	return b ? (b + 63) / 64 * 64 : 64;
}

/* the counted size is stored in front of each block */
static void *c_alloc(struct sl_backend *be, size_t bytes)
{
	struct counting *k = (struct counting *)be;
	size_t *p = k->cpu->alloc(k->cpu, bytes + 64);

	k->dev += r64(bytes);
	p[0] = r64(bytes);
	return (char *)p + 64;
}

static void c_free(struct sl_backend *be, void *q)
{
	struct counting *k = (struct counting *)be;
	size_t *p = (size_t *)((char *)q - 64);

	k->dev -= p[0];
	k->cpu->free(k->cpu, p);
}

static void *c_host_alloc(struct sl_backend *be, size_t bytes)
{
	struct counting *k = (struct counting *)be;
	size_t *p = calloc(1, bytes + 64);

	k->host += r64(bytes);
	p[0] = r64(bytes);
	return (char *)p + 64;
}

static void c_host_free(struct sl_backend *be, void *q)
{
	struct counting *k = (struct counting *)be;
	size_t *p = (size_t *)((char *)q - 64);

	k->host -= p[0];
	free(p);
}

static void check_counts(void)
{
	struct sl_model_config mc = {
		.model_type = "qwen3", .vocab = 97, .hidden = 24, .n_layers = 3, .n_heads = 4,
		.n_kv_heads = 2, .head_dim = 6, .intermediate = 40, .max_position = 64,
		.rms_eps = 1e-6, .rope_theta = 1e4, .num_labels = 1,
	};
	struct sl_layout lay;
	struct counting k = { 0 };
	const int B = 3, L = 11;

	k.cpu = sl_backend_cpu_create();
	k.be = *k.cpu;
	k.be.alloc = c_alloc;
	k.be.free = c_free;
	k.be.host_alloc = c_host_alloc;
	k.be.host_free = c_host_free;
	CHECK(sl_model_layout(&mc, 0, &lay) == 0);
	for (int off = SL_OFFLOAD_NONE; off <= SL_OFFLOAD_PARAMS; off++) {
		/* ck 2: offload optimizer's lean host layout, accum 3 */
		for (int ck = 0; ck < (off == SL_OFFLOAD_OPTIMIZER ? 3 : 2); ck++) {
			struct sl_config c;
			struct sl_plan_opts o = { .gpus = 1, .offload = -1, .ckpt = -1,
						  .force_lean = ck == 2 };
			struct sl_plan p;
			struct sl_shard sh;
			struct sl_shard_opts so = { .reshard_after_forward = true, .prefetch = 1,
						    .offload = off };
			int acc = ck == 1 ? 1 : 3;	/* 3: on the device (the cpu "GPU" has room) */
			struct sl_model *m;
			void *batch[4];

			sl_config_defaults(&c);
			c.backend = SL_BACKEND_CPU;
			c.train.batch = B;
			c.data.max_state = L;
			c.parallel.offload = off;
			c.train.activation_checkpointing = ck == 1;
			c.train.accum = acc;
			CHECK(sl_plan_compute(&c, &mc, &lay, &o, &p) == 0);
			CHECK(p.accum_dev == (off != SL_OFFLOAD_NONE && acc > 1));
			CHECK(p.lean == (ck == 2), "off %d ck %d lean %d", off, ck, p.lean);
			so.accum_on_device = p.accum_dev;
			so.accum = acc;
			so.host_lean = p.lean;

			CHECK(sl_shard_create(&sh, &k.be, &lay, &so) == 0);
			m = sl_model_create(&mc, &lay, &k.be, B * L, B, ck == 1);
			CHECK(m != NULL);
			/* train.c's device batch: ids, lens, last, labels */
			batch[0] = k.be.alloc(&k.be, (size_t)B * L * 4);
			for (int i = 1; i < 4; i++)
				batch[i] = k.be.alloc(&k.be, (size_t)B * 4);
			CHECK(k.dev == p.dev_total, "offload %d ckpt %d: allocated %zu, planned %zu",
			      off, ck, k.dev, p.dev_total);
			CHECK(k.host == p.host[SL_PLAN_OPTIM] + p.host[SL_PLAN_GRADS] +
			      p.host[SL_PLAN_WEIGHTS], "offload %d ckpt %d: host %zu, planned %zu",
			      off, ck, k.host, p.host[SL_PLAN_OPTIM] + p.host[SL_PLAN_GRADS] +
			      p.host[SL_PLAN_WEIGHTS]);
			for (int i = 0; i < 4; i++)
				k.be.free(&k.be, batch[i]);
			sl_model_destroy(m);
			sl_shard_destroy(&sh);
			CHECK(k.dev == 0 && k.host == 0, "leak: %zu %zu", k.dev, k.host);
		}
	}
	sl_layout_free(&lay);
	k.cpu->destroy(k.cpu);
}

static void check_parse(void)
{
	CHECK(sl_plan_parse_mem("80") == 80e9);
	CHECK(sl_plan_parse_mem("141GB") == 141e9);
	CHECK(sl_plan_parse_mem("2GiB") == 2.0 * 1073741824.0);
	CHECK(sl_plan_parse_mem("eighty") < 0);
	CHECK(sl_plan_parse_mem("80TB") < 0);
	CHECK(sl_plan_parse_mem("-1") < 0);
}

int main(void)
{
	check_parse();
	check_27b();
	check_counts();
	return test_exit("test_plan");
}
