/*
 * test_plan: the memory planner (src/plan.c).
 *
 * 1. The two 27B shapes, dense Qwen3 (test/fixtures/plan/qwen3-27b) and the Qwen3.5 hybrid
 *    (test/fixtures/plan/qwen3.5-27b), batch 1 x 2048 tokens, backend cuda (bf16 compute, float
 *    stats, 256-byte arena blocks): every category's bytes and every verdict against the hand
 *    calculation written out below, for 1 x 80 GB with no offload, optimizer offload with and
 *    without activation checkpointing, params offload; 1 x 141 GB with optimizer offload; 8 x 80
 *    GB FSDP.  The tables in README.md ("Will it fit?") are these.
 * 2. The planner counts what the code allocates: on a small Qwen3 model and a small Qwen3.5
 *    hybrid (3 Gated DeltaNet + 1 gated attention layer) with the cpu backend, the bytes
 *    sl_shard_create + sl_model_create + the trainer's device batch take from a counting backend
 *    equal the plan's device total, and the host bytes shard.c takes for offload equal the
 *    plan's offloaded host state, for every offload mode, with and without checkpointing, with
 *    the score head and with the causal-LM head (task sft; Qwen3 untied and tied).
 */
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "context.h"
#include "model.h"
#include "model_impl.h"
#include "plan.h"
#include "shard.h"
#include "testutil.h"

#define GB 1000000000.0

/* ---- 1. the 27B shapes by hand ----------------------------------------------------------- */

typedef unsigned long long ull;

/* the cuda arena hands out multiples of 256 bytes */
static ull r256(ull b)
{
	return (b + 255) / 256 * 256;
}

/*
 * A 27B shape as the hand calculation sees it: the units' sizes (embedding, the layers of each
 * kind, head) and the activations, each a number written out in the comment beside its shape.
 */
struct shape {
	const char *name;
	const char *fixture;		/* test/fixtures/plan/NAME/config.json */
	ull emb;			/* embedding unit, the largest unit */
	ull layer[2], n_layer[2];	/* unit sizes of the two layer kinds, how many of each */
	ull head;			/* head unit: final norm + score */
	ull p_all;			/* P, written out */
	/* what rounding each S = 1 shard up to 256 bytes adds: to 2P (bf16), to 4P (fp32) */
	ull round2, round4;
	ull act_all, act_ckpt;		/* activations bytes without / with checkpointing */
	/* bytes a Gated DeltaNet layer (n_layer[0] of them) keeps for the backward on cuda
	 * (gdn_states_extra), and the wants[] (bits) whose plan drops them to fit */
	ull gdn_aux;
	unsigned aux_dropped;
	ull ws_gdn;			/* the chunked delta rule's scratch past the 64 MiB */
	bool fits[9];			/* the verdicts, in the order of wants[] below */
};

/*
 * The 27B dense shape (test/fixtures/plan/qwen3-27b/config.json: hidden 5120, 64 layers, 40
 * heads, 8 KV heads, head_dim 128, intermediate 21504, vocab 151936).
 *
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
 *
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
 * always: x (64 layer inputs + final) 65 x 20,971,520 = 1,363,148,800; gx, gn 2 x 20,971,520;
 * gb1 T*max(2I, Q)*2 = 176,160,768; gb2 T*max(I, Q, 5120)*2 = 88,080,384:
 *   fixed = 1,363,148,800 + 41,943,040 + 176,160,768 + 88,080,384 = 1,669,332,992
 *   without checkpointing: fixed + 64 x 407,584,768 = 27,754,758,144
 *   with checkpointing:    fixed +  1 x 407,584,768 =  2,076,917,760
 */
static const struct shape dense27 = {
	.name = "dense", .fixture = "qwen3-27b",
	.emb = 777912320ull, .layer = { 393226496ull, 0 }, .n_layer = { 64, 0 },
	.head = 10240ull, .p_all = 25944418304ull, .round2 = 0, .round4 = 0,
	.act_all = 1669332992ull + 64 * 407584768ull, .act_ckpt = 1669332992ull + 407584768ull,
	/*
	 * totals (GiB, the sums of the terms in check_27b): 467.80, 87.00, 63.08, 41.59, 87.00,
	 * 88.12, 64.21, 60.76, 36.84 against 80 GB = 74.51 GiB (141 GB = 131.32 GiB)
	 */
	.fits = { false, false, true, true, true, false, true, true, true },
};

/*
 * The 27B hybrid shape, Qwen3.5-27B / Qwen3.6-27B (test/fixtures/plan/qwen3.5-27b/config.json,
 * model_type qwen3_5, the numbers of the published config.json's text_config as quoted by the
 * Qwen3.6-27B model card and http://eadst.com/blog/325: hidden 5120, 64 layers = 16 x (3
 * linear_attention + 1 full_attention), 24 heads, 4 KV heads, head_dim 256, rotary 64 dims
 * (partial_rotary_factor 0.25), Gated DeltaNet 16 key heads and 48 value heads of 128 x 128,
 * conv kernel 4, intermediate 17408, vocab 248320, lm_head untied (no matter here: the score
 * head replaces it)).  Assumed, not quoted by those pages: linear_conv_kernel_dim 4 (transformers'
 * Qwen3.5 default), rms_norm_eps 1e-6 (no byte depends on it).
 *
 * Parameters (elements), from the layout of src/model_qwen35.c (all sizes multiples of 16):
 *   embedding unit  V*H = 248320*5120                                    =  1,271,398,400
 *   Gated DeltaNet layer (48 of them); Cc = 2*16*128 + 48*128 = 10240 conv channels
 *     input_layernorm, post_attention_layernorm 2 x 5120                 =         10,240
 *     in_proj qkv|z|b|a (10240 + 48*128 + 48 + 48) x 5120 = 16480*5120   =     84,377,600
 *     conv1d 10240 x 4                                                   =         40,960
 *     dt_bias 48, A_log 48, norm 128                                     =            224
 *     out_proj 5120 x 48*128                                             =     31,457,280
 *     gate+up 2*17408 x 5120 + down 5120 x 17408                         =    267,386,880
 *     layer total                                                        =    383,273,184
 *   gated attention layer (16 of them)
 *     input_layernorm, post_attention_layernorm 2 x 5120                 =         10,240
 *     q_proj (query + gate) 2*24*256 x 5120                              =     62,914,560
 *     k_proj, v_proj 2 x 4*256 x 5120                                    =     10,485,760
 *     o_proj 5120 x 24*256                                               =     31,457,280
 *     q_norm, k_norm 256 + 256                                           =            512
 *     gate+up, down                                                      =    267,386,880
 *     layer total                                                        =    372,255,232
 *   head unit       norm H + score 1 x H                                 =         10,240
 *   P = 1,271,398,400 + 48 x 383,273,184 + 16 x 372,255,232 + 10,240     = 25,624,605,184
 * Unlike the dense shape's, a DeltaNet layer's bytes are no multiple of 256: its bf16 shard
 * 766,546,368 rounds up to 766,546,432 (+64), its fp32 one 1,533,092,736 to 1,533,092,864
 * (+128).  With S = 1 the device's bf16 weights are 2P + 48 x 64 = 51,249,213,440 bytes, each
 * fp32 copy 4P + 48 x 128 = 102,498,426,880 (the host's 64-byte rounding adds nothing).
 *
 * Activations at T = 2048 tokens, B = 1, bf16 (2 bytes), stats float (4 bytes) (struct
 * q35_acts of model_qwen35.c; every size a multiple of 256 bytes):
 *   both kinds     xn1, h, xn2 3 x T*5120*2 = 3 x 20,971,520              =     62,914,560
 *                  rstd1, rstd2 2 x T*4                                   =         16,384
 *                  gu T*2*17408*2 = 142,606,336, act T*17408*2 = 71,303,168 =  213,909,504
 *                  common                                                 =    276,840,448
 *   attention      proj T*14336*2 ((2*24 + 2*4)*256 wide)                 =     58,720,256
 *                  qkvr T*8192*2 ((24 + 2*4)*256 wide)                    =     33,554,432
 *                  gate, o, y 3 x T*6144*2 = 3 x 25,165,824               =     75,497,472
 *                  lse T*24*4                                             =        196,608
 *                  rstd_o T*(24+4)*4                                      =        229,376
 *                  attention layer's set (+ common)                       =    445,038,592
 *   Gated DeltaNet proj T*16480*2                                         =     67,502,080
 *                  cpre, c 2 x T*10240*2 = 2 x 41,943,040                 =     83,886,080
 *                  qn, kn 2 x T*16*128*2 = 2 x 8,388,608                  =     16,777,216
 *                  rqk T*2*16*4                                           =        262,144
 *                  beta, g 2 x T*48*4                                     =        786,432
 *                  states (T/64 + 2B) chunks x 48*128*128*4 = 34 x 3,145,728 = 106,954,752
 *                  o, y 2 x T*48*128*2 = 2 x 25,165,824                   =     50,331,648
 *                  rstd_o T*48*4                                          =        393,216
 *                  DeltaNet layer's set (+ common)                        =    603,734,016
 *   scratch        ones max(5120, 256)*2 10,240; wn1, wn2, wfin 3 x 10,240; wqn, wkn 2 x 512
 *                  (41,984); gproj T*max(16480, 14336)*2 67,502,080; gc T*10240*2
 *                  41,943,040; gqn, gkn 2 x 8,388,608; gbeta, gg 2 x T*48*2 = 2 x 196,608;
 *                  go, gy 2 x T*6144*2 = 2 x 25,165,824; gqkvr T*8192*2 33,554,432; ggate
 *                  T*6144*2 25,165,824                                    =    235,709,440
 *   model.c        x 65 x 20,971,520; gx, gn 2 x 20,971,520; gb1 T*max(2*17408, 8192)*2
 *                  142,606,336; gb2 T*max(17408, 8192, 6144)*2 71,303,168 =  1,619,001,344
 *   fixed = 1,619,001,344 + 235,709,440                                   =  1,854,710,784
 *   without checkpointing: fixed + 48 x 603,734,016 + 16 x 445,038,592    = 37,954,561,024
 *   with checkpointing: fixed + one set of each kind 603,734,016 + 445,038,592 = 2,903,483,392
 * On cuda a DeltaNet layer's states have room past them for the one-kernel forward's tiles
 * (gdn_states_extra: a 64-float head, then delta and diag(Ga) Q S0 of 64 x 128 floats each for
 * every value head of (T/64 + B) chunks): (64 + 2 x 33 x 48 x 64 x 128) x 4 = 103,809,280
 * bytes a layer (the states' buffer 106,954,752 + 103,809,280 = 210,764,032, a multiple of 256
 * still): 48 x 103,809,280 = 4,982,845,440 more without checkpointing, one layer's with it.
 * 16 x 80 GB without checkpointing fits only without them (76.80 GiB with, 72.15 without): the
 * plan drops them there.
 */
static const struct shape hybrid27 = {
	.name = "hybrid", .fixture = "qwen3.5-27b",
	.emb = 1271398400ull, .layer = { 383273184ull, 372255232ull }, .n_layer = { 48, 16 },
	.head = 10240ull, .p_all = 25624605184ull, .round2 = 48 * 64, .round4 = 48 * 128,
	.act_all = 37954561024ull, .act_ckpt = 2903483392ull,
	.gdn_aux = 103809280ull, .aux_dropped = 1u << 7,
	/*
	 * cuda/gdn_chunk.cu's backward grows the reduction scratch to dS at every chunk's end,
	 * fp32 dq, dk, every chunk's slot of k_gdn_prep and of k_gdn_grad_v: (T/64 + B) chunks x
	 * ((48*128 + 2*64*16)*128 + 48 x (64 x (128 + 128 + 3*64) + 64) + 48 x 64 x (128 + 2*64 +
	 * 8)) x 4 = 33 x (4,194,304 + 5,517,312 + 3,244,032) = 427,536,384: 360,427,520 past
	 * 64 MiB
	 */
	.ws_gdn = 360427520ull,
	/*
	 * totals (GiB): 479.66, 107.29, 70.11, 63.36, 107.29, 103.94, 66.75, 72.15, 39.61 against
	 * 80 GB = 74.51 GiB (141 GB = 131.32 GiB): 8 x 80 GB with checkpointing fits by 7.76 GiB
	 * (it missed by 1.07 GiB while the reduce-scatter staged the whole embedding in fp32, 4.74
	 * GiB, and every slot was the embedding's size); 16 GPUs fit without checkpointing (without
	 * the delta rule's saved tiles)
	 */
	.fits = { false, false, true, true, true, false, true, true, true },
};

/*
 * Head/loss + batch (B = 1): xl, xnf, gxnf, gxl 4 x 10,240; rstdf, logits, dlogits, loss,
 * scores, prune_q, lens, last, labels 9 x 256 (each rounded up); ids, tgt_pos, tgt_ids, pos
 * 4 x T*4 = 4 x 8,192:  76,032
 */
#define HEADBUF 76032ull
/* cuBLASLt workspace 32 MiB + reduction scratch 64 MiB + the side stream's 64 KiB (cuda/
 * context.cu allocates the three); CUDA context estimate 1900 MiB */
#define WS ((96ull << 20) + (64ull << 10))
#define CTX (1900ull << 20)

/* sum over units of r256(shard * bytes): shard = ceil(unit / S) */
static ull units(const struct shape *sh, ull S, ull bytes)
{
	ull b = r256((sh->emb + S - 1) / S * bytes) + r256((sh->head + S - 1) / S * bytes);

	for (int i = 0; i < 2; i++)
		b += sh->n_layer[i] * r256((sh->layer[i] + S - 1) / S * bytes);
	return b;
}

/* the shape's fixture config.json and its classify layout */
static void load_fixture(const struct shape *sh, struct sl_model_config *mc,
			 struct sl_layout *lay)
{
	char path[4096];
	const char *src = getenv("top_srcdir");

	snprintf(path, sizeof(path), "%s/test/fixtures/plan/%s/config.json", src ? src : "..",
		 sh->fixture);
	CHECK(sl_model_config_load(mc, path) == 0, "%s", path);
	CHECK(sl_model_layout(mc, 0, lay) == 0);
}

/* the reduce-scatter's fp32 staging: 512 MiB, less than either shape's embedding (4E) */
#define STAGE (512ull << 20)

struct want {
	const char *what;
	int gpus;
	double gpu_gb;
	int offload;
	bool ckpt;
	ull w, g, o, a, c;	/* weights, grads, master+moments, acts, comm */
	bool fits;
};

/*
 * The six layouts of issue 6 and the advice's answer to the last, for either shape (P, the embedding E = the largest unit):
 * A pool of n unit slots takes the n largest units' sizes: the embedding E and the largest layer
 * Lm (bf16: 2E, 2Lm each rounded to 256 bytes; with 8 ranks the units padded to a multiple of 8).
 * S = 1, no offload: weights = bf16 shard of every unit = 2P (the model reads its own shard in
 * place: no gather slots); gradients = 2 unit slots 2E + 2Lm + fp32
 * accumulators 4P; master + m + v = 12P (each plus the rounding the shape gives); comm = rs_out
 * (largest shard, fp32) 4E + the units' sums of squares, 66 doubles = 528 bytes, rounded: 768.
 * S = 1, offload optimizer: the same minus the fp32 state (grads = the 2 slots only: with the
 * default accum 2 the fp32 accumulators of earlier micro-batches, 4P, about 96 GiB, do not fit
 * beside the rest, so they add up on the host); comm adds offload's gradient staging ring, 2
 * fp32 shards of the largest unit = 2 x 4E.
 * S = 1, offload params: weights = 3 gathered units in flight (prefetch 1 + 2): 2E + 2 x 2Lm; comm as
 * with offload optimizer (uploads go straight into the slots).
 * Host, offload: master + m + v 12P, grad32 4P plus the ring's host half (accumulating on the
 * host) 2 x 4E, the bf16 copy AdamW writes 2P.
 * S = 8: shards of ceil(unit/8) (each buffer rounded to 256 bytes); weights = bf16 shards + 3
 * gather slots (2E + 2 x 2Lm); grads = 2 slots (2E + 2Lm) + fp32 shards; master+moments = 3
 * fp32 shards; comm = the fp32 reduce-scatter staging, 512 MiB (the embedding, 4E, goes through
 * it in rounds) + the largest fp32 shard 4 x E/8 + 768; with checkpointing only the activations
 * change.  S = 16 (two nodes of 8, FSDP over both): the same with 16 (E is a multiple of 16 in
 * both shapes).
 */
/* a unit slot of the largest layer, bf16, its elements padded to a multiple of S */
static ull lslot(const struct shape *sh, ull S)
{
	const ull lm = sh->layer[0] > sh->layer[1] ? sh->layer[0] : sh->layer[1];

	return r256(2 * ((lm + S - 1) / S * S));
}

/* the FSDP layout over S GPUs of 80 GB, no offload (fits: the shape's verdict for it) */
static struct want fsdp_want(const struct shape *sh, const char *what, ull S, bool ckpt,
			     bool fits)
{
	const ull units4 = units(sh, S, 4), E = sh->emb;

	return (struct want){ what, (int)S, 80, SL_OFFLOAD_NONE, ckpt,
			      units(sh, S, 2) + 2 * E + 2 * lslot(sh, S),
			      2 * E + lslot(sh, S) + units4, 3 * units4,
			      ckpt ? sh->act_ckpt : sh->act_all, STAGE + E / S * 4 + 768, fits };
}

static void check_27b(const struct shape *sh)
{
	struct sl_model_config mc;
	struct sl_layout lay;
	const ull P = sh->p_all, E = sh->emb, maxu2 = 2 * E, s1 = lslot(sh, 1);
	const ull w1 = 2 * P + sh->round2, f1 = 4 * P + sh->round4;	/* S = 1 bf16, fp32 */
	const ull comm1 = E * 4 + 768, ring = 2 * E * 4;
	const struct want wants[] = {
		{ "1 x 80 GB, no offload", 1, 80, SL_OFFLOAD_NONE, false,
		  w1, maxu2 + s1 + f1, 3 * f1, sh->act_all, comm1, sh->fits[0] },
		{ "1 x 80 GB, offload optimizer", 1, 80, SL_OFFLOAD_OPTIMIZER, false,
		  w1, maxu2 + s1, 0, sh->act_all, comm1 + ring, sh->fits[1] },
		{ "1 x 80 GB, offload optimizer + checkpointing", 1, 80, SL_OFFLOAD_OPTIMIZER, true,
		  w1, maxu2 + s1, 0, sh->act_ckpt, comm1 + ring, sh->fits[2] },
		{ "1 x 80 GB, offload params", 1, 80, SL_OFFLOAD_PARAMS, false,
		  maxu2 + 2 * s1, maxu2 + s1, 0, sh->act_all, comm1 + ring, sh->fits[3] },
		{ "1 x 141 GB, offload optimizer", 1, 141, SL_OFFLOAD_OPTIMIZER, false,
		  w1, maxu2 + s1, 0, sh->act_all, comm1 + ring, sh->fits[4] },
		fsdp_want(sh, "8 x 80 GB FSDP", 8, false, sh->fits[5]),
		fsdp_want(sh, "8 x 80 GB FSDP + checkpointing", 8, true, sh->fits[6]),
		fsdp_want(sh, "16 x 80 GB FSDP (2 nodes)", 16, false, sh->fits[7]),
		fsdp_want(sh, "16 x 80 GB FSDP + checkpointing", 16, true, sh->fits[8]),
	};
	load_fixture(sh, &mc, &lay);
	/* P written out, against the sum of the units above and the layout */
	CHECK(E + sh->n_layer[0] * sh->layer[0] + sh->n_layer[1] * sh->layer[1] + sh->head == P,
	      "%s: P", sh->name);
	CHECK(lay.total_numel == P, "%s: P %zu", sh->name, lay.total_numel);
	CHECK(lay.unit_numel[0] == E, "%s: embedding %zu", sh->name, lay.unit_numel[0]);
	for (int u = 1; u <= mc.n_layers; u++)
		CHECK(lay.unit_numel[u] == sh->layer[sh->n_layer[1] && (u % 4) == 0] &&
		      lay.unit_numel[u] < E, "%s: unit %d: %zu", sh->name, u, lay.unit_numel[u]);

	for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++) {
		const struct want *w = &wants[i];
		struct sl_config c;
		struct sl_plan_opts o = { .gpus = w->gpus, .gpu_mem = w->gpu_gb * GB,
					  .offload = -1, .ckpt = -1 };
		struct sl_plan p;
		const bool dropped = sh->aux_dropped >> i & 1;
		const ull aux = dropped ? 0 : (w->ckpt ? 1 : sh->n_layer[0]) * sh->gdn_aux;
		ull total = w->w + w->g + w->o + w->a + aux + w->c + HEADBUF + WS + sh->ws_gdn +
			    CTX;

		sl_config_defaults(&c);
		snprintf(c.source, sizeof(c.source), "27b");
		c.backend = SL_BACKEND_CUDA;
		c.train.batch = 1;
		c.data.max_state = 2048;
		c.parallel.offload = w->offload;
		c.train.activation_checkpointing = w->ckpt;
		CHECK(sl_plan_compute(&c, &mc, &lay, &o, &p) == 0);
		CHECK(p.params == P, "%s %s: P %zu", sh->name, w->what, p.params);
		CHECK(p.dev[SL_PLAN_WEIGHTS] == w->w, "%s %s: weights %zu, want %llu", sh->name,
		      w->what, p.dev[SL_PLAN_WEIGHTS], w->w);
		CHECK(p.dev[SL_PLAN_GRADS] == w->g, "%s %s: grads %zu, want %llu", sh->name,
		      w->what, p.dev[SL_PLAN_GRADS], w->g);
		CHECK(p.dev[SL_PLAN_OPTIM] == w->o, "%s %s: optim %zu, want %llu", sh->name,
		      w->what, p.dev[SL_PLAN_OPTIM], w->o);
		CHECK(p.dev[SL_PLAN_ACTS] == w->a + aux, "%s %s: acts %zu, want %llu", sh->name,
		      w->what, p.dev[SL_PLAN_ACTS], w->a + aux);
		CHECK(p.gdn_aux == (sh->gdn_aux && !dropped) && p.gdn_aux_dropped == dropped,
		      "%s %s: the delta rule's saved tiles %d, dropped %d", sh->name, w->what,
		      p.gdn_aux, p.gdn_aux_dropped);
		CHECK(p.dev[SL_PLAN_COMM] == w->c, "%s %s: comm %zu, want %llu", sh->name, w->what,
		      p.dev[SL_PLAN_COMM], w->c);
		CHECK(p.dev[SL_PLAN_HEAD] == HEADBUF, "%s %s: head %zu", sh->name, w->what,
		      p.dev[SL_PLAN_HEAD]);
		CHECK(p.dev_total == total, "%s %s: total %zu, want %llu", sh->name, w->what,
		      p.dev_total, total);
		CHECK(p.gpu_fits == w->fits, "%s %s: verdict %d, want %d (%.2f GiB of %.2f GiB)",
		      sh->name, w->what, p.gpu_fits, w->fits, p.dev_total / 1073741824.0,
		      w->gpu_gb * GB / 1073741824.0);
		/* host: fp32 master + m + v (12P), accumulators 4P + the ring's host half, bf16 2P */
		if (w->offload != SL_OFFLOAD_NONE) {
			CHECK(!p.accum_dev, "%s %s: accumulation should not fit the GPU", sh->name,
			      w->what);
			CHECK(p.host[SL_PLAN_OPTIM] == 12 * P, "%s %s", sh->name, w->what);
			CHECK(p.host[SL_PLAN_GRADS] == 4 * P + 2 * E * 4, "%s %s", sh->name,
			      w->what);
		}
		CHECK(p.host[SL_PLAN_WEIGHTS] == (w->offload != SL_OFFLOAD_NONE ? 2 * P : 0),
		      "%s %s", sh->name, w->what);
		printf("%-7s %-46s %8.2f GiB  %s\n", sh->name, w->what, p.dev_total / 1073741824.0,
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

/*
 * What sl_shard_create + sl_model_create + the trainer's device batch (train.c's
 * dev_batch_alloc) take from the counting backend against the plan, for model @mc at @B records
 * of @L tokens: every offload mode, checkpointing off and on, offload optimizer's lean host
 * layout.
 */
static void no_gather(void *ctx, void *recv, const void *send, size_t count)
{
}

static void no_wait(void *ctx)
{
}

static void no_sum(void *ctx, double *buf, size_t n)
{
}

static void *grad_room(void *ctx, int unit, bool during, size_t *bytes)
{
	return sl_model_grad_room(ctx, unit, during, bytes);
}

/*
 * @C > 1: parallel.context C, the model made for 1/C of each row (padded to a multiple of 2C,
 * as train.c does), its context-parallel buffers made as at the first such micro-batch
 * (sl_cp_check, with a context group whose collectives are never called), and context.c's
 * context-parallel batch.
 */
static void check_counts(const struct sl_model_config *mc, int task, int B, int L, int C)
{
	struct sl_layout lay;
	struct counting k = { 0 };

	k.cpu = sl_backend_cpu_create();
	k.be = *k.cpu;
	k.be.alloc = c_alloc;
	k.be.free = c_free;
	k.be.host_alloc = c_host_alloc;
	k.be.host_free = c_host_free;
	CHECK(sl_model_layout(mc, task, &lay) == 0);
	for (int off = SL_OFFLOAD_NONE; off <= SL_OFFLOAD_PARAMS; off++) {
		/* ck 0: accum 3; 1: checkpointing, accum 1; 2: offload optimizer's lean host
		 * layout, accum 3; 3: accum 1 (no offload: the layers' gradients in their
		 * activations, sl_model_grad_room) */
		for (int ck = 0; ck < 4; ck++) {
			struct sl_config c;
			struct sl_plan_opts o = { .gpus = 1, .offload = -1, .ckpt = -1,
						  .force_lean = ck == 2 };
			struct sl_plan p;
			struct sl_shard sh;
			struct sl_shard_opts so = { .reshard_after_forward = true, .prefetch = 1,
						    .offload = off };
			/* 3: on the device (the cpu "GPU" has room) */
			int acc = ck == 1 || ck == 3 ? 1 : 3;
			struct sl_model *m;
			void *batch[7], *cpbuf[11];
			const int Lrow = C > 1 ? sl_cp_row_len(L, C) : (L + 1) / 2 * 2;
			size_t hplan, lent = 0;

			if (ck == 2 && off != SL_OFFLOAD_OPTIMIZER)
				continue;
			sl_config_defaults(&c);
			c.backend = SL_BACKEND_CPU;
			c.task = task;
			c.train.batch = B;
			c.data.max_state = L;
			c.parallel.offload = off;
			c.train.activation_checkpointing = ck == 1;
			c.train.accum = acc;
			c.parallel.context = C;
			CHECK(sl_plan_compute(&c, mc, &lay, &o, &p) == 0);
			CHECK(p.accum_dev == (off != SL_OFFLOAD_NONE && acc > 1));
			CHECK(p.lean == (ck == 2), "off %d ck %d lean %d", off, ck, p.lean);
			so.accum_on_device = p.accum_dev;
			so.accum = acc;
			so.host_lean = p.lean;

			/* as train.c: the model first, its activations lent to the gradients */
			m = sl_model_create(mc, &lay, &k.be, B * (Lrow / C), B, ck == 1);
			CHECK(m != NULL);
			so.grad_room = grad_room;
			so.grad_room_ctx = m;
			CHECK(sl_shard_create(&sh, &k.be, &lay, &so) == 0);
			for (int u = 0; u < lay.n_units; u++)
				lent += sh.u[u].grad_lent ? sh.u[u].shard * sh.grad_elt : 0;
			CHECK(sh.grad_direct == p.grad_direct && sh.grad_direct ==
			      (acc == 1 && off == SL_OFFLOAD_NONE), "%s task %d offload %d ckpt %d: "
			      "direct %d, planned %d", mc->model_type, task, off, ck,
			      sh.grad_direct, p.grad_direct);
			CHECK(lent == p.lent_grads, "%s task %d offload %d ckpt %d: lent %zu, "
			      "planned %zu", mc->model_type, task, off, ck, lent, p.lent_grads);
			/* the qwen3 model's layers lend whenever a step has one micro-batch and
			 * their activations are kept */
			CHECK((lent > 0) == (!mc->norm_offset && ck == 3 && off == SL_OFFLOAD_NONE),
			      "%s task %d offload %d ckpt %d: lent %zu", mc->model_type, task, off,
			      ck, lent);
			if (C > 1) {
				struct sl_context_comm cc = { .kv_all_gather = no_gather,
							      .kv_all_gather_start = no_gather,
							      .kv_all_gather_wait = no_wait,
							      .kv_reduce_scatter = no_gather,
							      .sum_f64 = no_sum, .size = C };
				struct sl_cp_batch cpb = { .comm = &cc, .L = Lrow };
				struct sl_batch_dev bd = { .B = B, .L = Lrow / C, .cp = &cpb };

				CHECK(sl_cp_check(m, &bd) == 0, "context-parallel buffers");
				/* context.c: ids, gidx, pos, perm, inv, tgt_pos, tgt_ids; lens,
				 * last, labels; clens */
				for (int i = 0; i < 7; i++)
					cpbuf[i] = k.be.alloc(&k.be, (size_t)B * Lrow * 4);
				for (int i = 7; i < 10; i++)
					cpbuf[i] = k.be.alloc(&k.be, (size_t)B * 4);
				cpbuf[10] = k.be.alloc(&k.be, (size_t)2 * B * 4);
			}
			/* train_batch.c's device batch: ids, lens, last, labels, tgt_pos, tgt_ids, pos */
			batch[0] = k.be.alloc(&k.be, (size_t)B * L * 4);
			for (int i = 1; i < 4; i++)
				batch[i] = k.be.alloc(&k.be, (size_t)B * 4);
			for (int i = 4; i < 7; i++)
				batch[i] = k.be.alloc(&k.be, (size_t)B * L * 4);
			CHECK(k.dev == p.dev_total, "%s task %d offload %d ckpt %d context %d: "
			      "allocated %zu, planned %zu", mc->model_type, task, off, ck, C, k.dev,
			      p.dev_total);
			hplan = p.host[SL_PLAN_OPTIM] + p.host[SL_PLAN_GRADS] +
				p.host[SL_PLAN_WEIGHTS];
			CHECK(k.host == hplan, "%s task %d offload %d ckpt %d: host %zu, planned %zu",
			      mc->model_type, task, off, ck, k.host, hplan);
			for (int i = 0; i < 7; i++)
				k.be.free(&k.be, batch[i]);
			for (int i = 0; C > 1 && i < 11; i++)
				k.be.free(&k.be, cpbuf[i]);
			sl_shard_destroy(&sh);
			sl_model_destroy(m);
			CHECK(k.dev == 0 && k.host == 0, "leak: %zu %zu", k.dev, k.host);
		}
	}
	sl_layout_free(&lay);
	k.cpu->destroy(k.cpu);
}

static void check_counts_qwen3(void)
{
	struct sl_model_config mc = {
		.model_type = "qwen3", .vocab = 97, .hidden = 24, .n_layers = 3, .n_heads = 4,
		.n_kv_heads = 2, .head_dim = 6, .intermediate = 40, .max_position = 64,
		.rms_eps = 1e-6, .rope_theta = 1e4, .num_labels = 1,
	};

	check_counts(&mc, SL_TASK_CLASSIFY, 3, 11, 1);
	/* the causal-LM head: (tokens x V) logits in chunks, head rows = tokens; untied, tied */
	check_counts(&mc, SL_TASK_SFT, 3, 11, 1);
	/* context parallel: 11 tokens padded to 24 (2 x 3 ranks' chunks of at least 4 tokens) */
	check_counts(&mc, SL_TASK_SFT, 3, 11, 3);
	mc.tie_word_embeddings = true;
	check_counts(&mc, SL_TASK_SFT, 3, 11, 1);
}

/*
 * A small Qwen3.5 text model, 3 Gated DeltaNet layers and 1 gated attention layer; widths that
 * are no multiples of anything (conv channels 2*2*6 + 4*5 = 44, projection 44 + 20 + 8 = 72),
 * and 3 records of 30 tokens, so that the chunk-start states hold T/64 + 2B = 1 + 6 chunks.
 */
static void check_counts_qwen35(void)
{
	enum sl_layer_kind lk[4] = {
		SL_LAYER_LINEAR_ATTENTION, SL_LAYER_LINEAR_ATTENTION, SL_LAYER_LINEAR_ATTENTION,
		SL_LAYER_GATED_ATTENTION,
	};
	enum sl_mlp_kind mk[4] = { SL_MLP_DENSE, SL_MLP_DENSE, SL_MLP_DENSE, SL_MLP_DENSE };
	struct sl_model_config mc = {
		.model_type = "qwen3_5_text", .vocab = 97, .hidden = 24, .n_layers = 4,
		.n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .intermediate = 40,
		.max_position = 64, .rms_eps = 1e-6, .rope_theta = 1e4, .num_labels = 1,
		.norm_offset = true, .rot_dim = 2, .lin_nk = 2, .lin_nv = 4, .lin_dk = 6,
		.lin_dv = 5, .lin_conv = 4, .layer_kind = lk, .mlp_kind = mk,
	};

	check_counts(&mc, SL_TASK_CLASSIFY, 3, 30, 1);
	check_counts(&mc, SL_TASK_SFT, 3, 30, 1);
	/* context parallel: the gated attention's whole-row state, the DeltaNet's passed state */
	check_counts(&mc, SL_TASK_SFT, 3, 30, 2);
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

/*
 * One micro-batch a step (train.accum 1), no offload: the shard has no rs_out (comm loses its
 * 4E, or 4 x E/8 with 8 ranks), and a layer unit's gradient shard (fp32; bf16 on one GPU)
 * lives in that layer's activations when they are kept (no checkpointing) and large enough.  Dense 27B, T = 2048:
 * one layer's set 407,584,768 bytes (above).  1 GPU: a layer's gradient 4 x 393,226,496 =
 * 1,572,905,984 bytes does not fit in it; 8 GPUs: 4 x 393,226,496 / 8 = 196,613,248 does (its
 * block rounded up to 196,613,376), for
 * all 64 layers: grads = the 2 unit slots (2E + 2Lm) + the embedding's and the head's shards
 * only.
 */
static void check_lent(void)
{
	const struct shape *sh = &dense27;
	const ull E = sh->emb, maxu2 = 2 * E, f1 = 4 * sh->p_all + sh->round4, s8 = lslot(sh, 8);
	const ull lay8 = r256(sh->layer[0] / 8 * 4);
	struct {
		const char *what;
		int gpus;
		bool ckpt;
		ull g, c, lent;
	} wants[] = {
		/* one GPU: the gradients in bf16 where the backward writes them (shard.c
		 * grad_direct): the bf16 shards, no slots; a layer's 2 x 393,226,496 bytes do
		 * not fit in its activations either */
		{ "1 GPU, accum 1", 1, false, 2 * sh->p_all + sh->round2, 768, 0 },
		{ "8 GPUs, accum 1", 8, false, maxu2 + s8 + units(sh, 8, 4) - 64 * lay8,
		  STAGE + 768, 64 * 196613248ull },
		{ "8 GPUs, accum 1, checkpointing", 8, true, maxu2 + s8 + units(sh, 8, 4),
		  STAGE + 768, 0 },
	};
	struct sl_model_config mc;
	struct sl_layout lay;
	load_fixture(sh, &mc, &lay);
	CHECK(196613248ull * 8 == 4 * sh->layer[0] && lay8 == 196613376ull);
	for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++) {
		struct sl_config c;
		struct sl_plan_opts o = { .gpus = wants[i].gpus, .offload = -1, .ckpt = -1 };
		struct sl_plan p;

		sl_config_defaults(&c);
		c.backend = SL_BACKEND_CUDA;
		c.train.batch = 1;
		c.train.accum = 1;
		c.data.max_state = 2048;
		c.train.activation_checkpointing = wants[i].ckpt;
		CHECK(sl_plan_compute(&c, &mc, &lay, &o, &p) == 0);
		CHECK(p.dev[SL_PLAN_GRADS] == wants[i].g, "lent %s: grads %zu, want %llu",
		      wants[i].what, p.dev[SL_PLAN_GRADS], wants[i].g);
		CHECK(p.dev[SL_PLAN_COMM] == wants[i].c, "lent %s: comm %zu, want %llu",
		      wants[i].what, p.dev[SL_PLAN_COMM], wants[i].c);
		CHECK(p.lent_grads == wants[i].lent, "lent %s: %zu, want %llu", wants[i].what,
		      p.lent_grads, wants[i].lent);
		CHECK(p.grad_direct == (wants[i].gpus == 1), "lent %s: direct %d", wants[i].what,
		      p.grad_direct);
		CHECK(p.dev[SL_PLAN_OPTIM] == 3 * (wants[i].gpus == 1 ? f1 : units(sh, 8, 4)),
		      "lent %s: optim %zu", wants[i].what, p.dev[SL_PLAN_OPTIM]);
	}
	sl_layout_free(&lay);
	sl_model_config_free(&mc);
}

/*
 * shard.c's slot choice, by hand: the free slot that holds the unit and is smallest, of those an
 * empty one, else the least recently used; none when every large-enough slot is in use.
 */
static void check_pick_slot(void)
{
	struct sl_shard_slot pool[4] = {
		{ .cap = 10, .unit = -1 }, { .cap = 5, .unit = 3, .last_use = 7 },
		{ .cap = 5, .unit = 4, .last_use = 2 }, { .cap = 5, .unit = -1 },
	};

	CHECK(sl_shard_pick_slot(pool, 4, 5) == &pool[3], "an empty 5 before the held ones");
	CHECK(sl_shard_pick_slot(pool, 4, 6) == &pool[0], "only the 10 holds 6");
	CHECK(sl_shard_pick_slot(pool, 4, 10) == &pool[0]);
	pool[3].in_use = true;
	CHECK(sl_shard_pick_slot(pool, 4, 5) == &pool[2], "the least recently used 5");
	pool[2].in_use = true;
	CHECK(sl_shard_pick_slot(pool, 4, 1) == &pool[1]);
	pool[1].in_use = true;
	CHECK(sl_shard_pick_slot(pool, 4, 5) == &pool[0], "the 10 when every 5 is in use");
	pool[0].in_use = true;
	CHECK(sl_shard_pick_slot(pool, 4, 1) == NULL, "all in use");
	pool[0].in_use = false;
	pool[1].in_use = false;
	CHECK(sl_shard_pick_slot(pool, 4, 11) == NULL, "nothing holds 11");
}

int main(void)
{
	check_pick_slot();
	check_parse();
	check_27b(&dense27);
	check_27b(&hybrid27);
	check_lent();
	check_counts_qwen3();
	check_counts_qwen35();
	return test_exit("test_plan");
}
