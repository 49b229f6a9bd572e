/*
 * test_safetensors: the safetensors reader/writer, HF path resolution and config.json parsing.
 *
 * Every malformed file is written here byte by byte (a header JSON string + data), and each must be
 * refused with a message naming the file and the tensor (stderr is captured and searched).  Expected
 * values are hand-computed bit patterns (bf16/f16), hand-written configs and hand-built layouts;
 * nothing is derived from the code under test.
 */
/* testutil.h's CHECK(cond) without a message expands to an empty format string */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

static char tmp[4096];		/* this run's scratch dir */
static char captured[65536];	/* stderr of the last CAPTURE */
static int saved_stderr = -1;

/* ---- helpers --------------------------------------------------------------------------------- */

static void begin_capture(void)
{
	char p[4200];
	int fd;

	fflush(stderr);
	snprintf(p, sizeof(p), "%s/stderr.txt", tmp);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	saved_stderr = dup(2);
	dup2(fd, 2);
	close(fd);
}

static void end_capture(void)
{
	char p[4200];
	size_t n = 0;
	FILE *f;

	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	snprintf(p, sizeof(p), "%s/stderr.txt", tmp);
	f = fopen(p, "r");
	if (f) {
		n = fread(captured, 1, sizeof(captured) - 1, f);
		fclose(f);
	}
	captured[n] = 0;
}

/* run @call (returns int) with stderr captured; it must fail and its message contain @a and @b */
#define CHECK_FAILS(call, a, b)                                                               \
	do {                                                                                  \
		int _r;                                                                       \
		begin_capture();                                                              \
		_r = (call);                                                                  \
		end_capture();                                                                \
		printf("expected: %s", captured);                                             \
		CHECK(_r < 0, "%s returned %d", #call, _r);                                   \
		CHECK(strstr(captured, (a)) != NULL, "message lacks '%s': %s", (a), captured); \
		CHECK(strstr(captured, (b)) != NULL, "message lacks '%s': %s", (b), captured); \
	} while (0)

static const char *P(const char *fmt, const char *name)
{
	/* enough that a test's earlier paths survive its later calls */
	static char bufs[64][4200];
	static int k;
	char *b = bufs[k++ % 64];

	snprintf(b, 4200, "%s/", tmp);
	snprintf(b + strlen(b), 4200 - strlen(b), fmt, name);
	return b;
}

static void mkdir_p(const char *path)
{
	char p[4200];

	snprintf(p, sizeof(p), "%s", path);
	for (char *s = p + 1; *s; s++) {
		if (*s == '/') {
			*s = 0;
			mkdir(p, 0755);
			*s = '/';
		}
	}
	mkdir(p, 0755);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");

	if (!f) {
		perror(path);
		exit(1);
	}
	fwrite(data, 1, n, f);
	fclose(f);
}

static void write_text(const char *path, const char *text)
{
	write_bytes(path, text, strlen(text));
}

/* a safetensors file from a header string and raw data bytes; @hlen (u64 LE) as given */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, const void *data,
			 size_t n)
{
	FILE *f = fopen(path, "wb");

	fwrite(&hlen, 8, 1, f);
	fwrite(header, 1, strlen(header), f);
	if (n)
		fwrite(data, 1, n, f);
	fclose(f);
}

static void write_st(const char *path, const char *header, const void *data, size_t n)
{
	write_st_raw(path, strlen(header), header, data, n);
}

/* a hand-built layout: tensors appended unit by unit */
struct lay_builder {
	struct sl_layout lay;
	struct sl_tensor_info t[32];
	size_t unit_numel[4];
};

static void lay_init(struct lay_builder *b, int n_units)
{
	memset(b, 0, sizeof(*b));
	b->lay.t = b->t;
	b->lay.unit_numel = b->unit_numel;
	b->lay.n_units = n_units;
}

static void lay_add(struct lay_builder *b, const char *name, int unit, int ndim, int64_t d0,
		    int64_t d1, bool optional, enum sl_init init)
{
	struct sl_tensor_info *t = &b->t[b->lay.n_tensors++];

	snprintf(t->name, sizeof(t->name), "%s", name);
	t->unit = unit;
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = ndim == 2 ? d1 : 0;
	t->numel = ndim == 2 ? d0 * d1 : d0;
	t->offset = b->unit_numel[unit];
	t->optional = optional;
	t->init = init;
	b->unit_numel[unit] += t->numel;
	b->lay.total_numel += t->numel;
}

/* a file of test/fixtures/st, from the source tree or, run by hand in test/, from here */
static const char *fixture(const char *name)
{
	static char p[4200];

	snprintf(p, sizeof(p), "%s/test/fixtures/st/%s", test_srcdir(), name);
	if (access(p, F_OK))
		snprintf(p, sizeof(p), "fixtures/st/%s", name);
	return p;
}

static uint16_t bits16_at(const struct sl_st_tensor *t, size_t i)
{
	uint16_t h;

	memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
	return h;
}

/* ---- conversions ----------------------------------------------------------------------------- */

static void test_conversions(void)
{
	float nan_in = NAN;

	/* f16: sign 1, exponent 5 (bias 15), mantissa 10 */
	CHECK(sl_f16_to_f32(0x3c00) == 1.0f);
	CHECK(sl_f16_to_f32(0xc000) == -2.0f);
	CHECK(sl_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "smallest subnormal");
	CHECK(sl_f16_to_f32(0x03ff) == 1023 * ldexpf(1.0f, -24), "largest subnormal");
	CHECK(sl_f16_to_f32(0x0400) == ldexpf(1.0f, -14), "smallest normal");
	CHECK(sl_f16_to_f32(0x7bff) == 65504.0f, "largest normal");
	CHECK(isinf(sl_f16_to_f32(0x7c00)) && sl_f16_to_f32(0x7c00) > 0);
	CHECK(isinf(sl_f16_to_f32(0xfc00)) && sl_f16_to_f32(0xfc00) < 0);
	CHECK(isnan(sl_f16_to_f32(0x7e00)));
	CHECK(sl_f16_to_f32(0x8000) == 0 && signbit(sl_f16_to_f32(0x8000)), "-0");
	/* 0x3555: exponent 13 (2^-2), mantissa 0x155: 0.333251953125 */
	CHECK(sl_f16_to_f32(0x3555) == 0.333251953125f, "0.333 in f16");

	/* bf16 = the top 16 bits of a float */
	CHECK(sl_bf16_to_f32(0x3f80) == 1.0f);
	CHECK(sl_bf16_to_f32(0xc040) == -3.0f);
	CHECK(sl_bf16_to_f32(0x4049) == 3.140625f);
	CHECK(sl_f32_to_bf16(1.0f) == 0x3f80);
	CHECK(sl_f32_to_bf16(3.0f) == 0x4040);
	CHECK(sl_f32_to_bf16(-2.0f) == 0xc000);
	/* 1 + 2^-8 lies halfway between 0x3f80 and 0x3f81: ties go to the even 0x3f80 */
	CHECK(sl_f32_to_bf16(1.00390625f) == 0x3f80, "got 0x%04x", sl_f32_to_bf16(1.00390625f));
	/* 1 + 3*2^-8 lies halfway between 0x3f81 and 0x3f82: even is 0x3f82 */
	CHECK(sl_f32_to_bf16(1.01171875f) == 0x3f82, "got 0x%04x", sl_f32_to_bf16(1.01171875f));
	/* just above the tie rounds up */
	CHECK(sl_f32_to_bf16(nextafterf(1.00390625f, 2)) == 0x3f81);
	CHECK(sl_f32_to_bf16(nextafterf(1.00390625f, 0)) == 0x3f80);
	CHECK(sl_f32_to_bf16(3.14159265f) == 0x4049);
	CHECK(sl_f32_to_bf16(INFINITY) == 0x7f80);
	CHECK(sl_f32_to_bf16(-INFINITY) == 0xff80);
	CHECK(sl_f32_to_bf16(3.4028235e38f) == 0x7f80, "FLT_MAX rounds to inf");
	CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(nan_in))), "NaN stays NaN");
	{
		uint32_t u = 0x7f800001;	/* NaN whose payload is only in the low bits */
		float f;

		memcpy(&f, &u, 4);
		CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(f))), "low-payload NaN stays NaN");
	}

	/* the generator: deterministic, and normal(0, std) in its first two moments */
	{
		enum { N = 200000 };
		static float x[N], y[N];
		double s = 0, s2 = 0;

		sl_st_fill_normal(x, N, 0.5, 42);
		sl_st_fill_normal(y, N, 0.5, 42);
		CHECK(!memcmp(x, y, sizeof(x)), "same seed, same numbers");
		sl_st_fill_normal(y, N, 0.5, 43);
		CHECK(memcmp(x, y, sizeof(x)), "another seed, other numbers");
		for (int i = 0; i < N; i++) {
			s += x[i];
			s2 += (double)x[i] * x[i];
		}
		CHECK_CLOSE(s / N, 0.0, 0, 0.005);
		CHECK_CLOSE(sqrt(s2 / N), 0.5, 0.01, 0);
	}
}

/* ---- writing --------------------------------------------------------------------------------- */

static void test_write_roundtrip(void)
{
	float a[6] = { 1.0f, -2.5f, 3.14159265f, 1e-30f, -0.0f, 65504.0f };
	float b[3] = { 1.00390625f, 1.01171875f, 3.0f };
	struct sl_st_out out[2] = {
		{ .name = "b", .ndim = 1, .shape = { 3 }, .data = b },
		{ .name = "a.weight", .ndim = 2, .shape = { 2, 3 }, .data = a },
	};
	const struct sl_st_tensor *t;
	struct sl_weights w;
	float got[6];
	uint64_t hlen;
	FILE *f;

	CHECK(sl_st_write(P("%s", "rt32.safetensors"), out, 2, SL_DT_F32) == 0);
	CHECK(access(P("%s", "rt32.safetensors.tmp"), F_OK) != 0, "temp file renamed away");
	f = fopen(P("%s", "rt32.safetensors"), "rb");
	CHECK(f && fread(&hlen, 8, 1, f) == 1);
	if (f)
		fclose(f);
	CHECK(hlen % 8 == 0, "header padded to 8 bytes (%llu)", (unsigned long long)hlen);
	CHECK(sl_weights_open_file(&w, P("%s", "rt32.safetensors")) == 0);
	CHECK(w.n_tensors == 2);
	t = sl_weights_find(&w, "a.weight");
	CHECK(t && t->dtype == SL_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
	/* "b" is first in the data: the data starts 8-byte aligned */
	CHECK(((const char *)sl_weights_find(&w, "b")->data - (const char *)w.files[0].map) % 8 == 0,
	      "data aligned");
	if (t) {
		sl_st_to_f32(t, got);
		CHECK(!memcmp(got, a, sizeof(a)), "F32 exact");
	}
	CHECK(sl_weights_find(&w, "nope") == NULL);
	sl_weights_close(&w);

	CHECK(sl_st_write(P("%s", "rt16.safetensors"), out, 2, SL_DT_BF16) == 0);
	CHECK(sl_weights_open_file(&w, P("%s", "rt16.safetensors")) == 0);
	t = sl_weights_find(&w, "b");
	CHECK(t && t->dtype == SL_DT_BF16 && !strcmp(t->dtype_name, "BF16") && t->nbytes == 6);
	if (t) {
		CHECK(bits16_at(t, 0) == 0x3f80, "tie to even: 0x%04x", bits16_at(t, 0));
		CHECK(bits16_at(t, 1) == 0x3f82, "tie to even: 0x%04x", bits16_at(t, 1));
		CHECK(bits16_at(t, 2) == 0x4040, "3.0: 0x%04x", bits16_at(t, 2));
	}
	t = sl_weights_find(&w, "a.weight");
	if (t) {
		CHECK(bits16_at(t, 0) == 0x3f80);
		CHECK(bits16_at(t, 1) == 0xc020, "-2.5: 0x%04x", bits16_at(t, 1));
		CHECK(bits16_at(t, 2) == 0x4049, "pi: 0x%04x", bits16_at(t, 2));
		CHECK(bits16_at(t, 4) == 0x8000, "-0: 0x%04x", bits16_at(t, 4));
		sl_st_to_f32(t, got);
		CHECK(got[0] == 1.0f && got[1] == -2.5f && got[2] == 3.140625f);
	}
	sl_weights_close(&w);

	/* a tensor large enough for the threaded conversion */
	{
		enum { N = (1 << 20) + 4097 };
		float *x = malloc(N * sizeof(*x)), *y = malloc(N * sizeof(*y));
		struct sl_st_out big = { .name = "big", .ndim = 1, .shape = { N }, .data = x };
		int bad = 0;

		sl_st_fill_normal(x, N, 1.0, 9);
		CHECK(sl_st_write(P("%s", "big.safetensors"), &big, 1, SL_DT_BF16) == 0);
		CHECK(sl_weights_open_file(&w, P("%s", "big.safetensors")) == 0);
		t = sl_weights_find(&w, "big");
		CHECK(t && t->numel == N && t->nbytes == 2 * (size_t)N);
		if (t) {
			sl_st_to_f32(t, y);
			for (int i = 0; i < N; i++)
				bad += y[i] != sl_bf16_to_f32(sl_f32_to_bf16(x[i]));
		}
		CHECK(bad == 0, "%d of %d differ", bad, N);
		sl_weights_close(&w);
		free(x);
		free(y);
	}

	/* the header a Python reader sees: plain JSON with the metadata transformers writes */
	{
		char hdr[512] = "";

		f = fopen(P("%s", "rt16.safetensors"), "rb");
		if (f) {
			CHECK(fread(&hlen, 8, 1, f) == 1 && hlen < sizeof(hdr));
			CHECK(fread(hdr, 1, hlen, f) == hlen);
			fclose(f);
		}
		CHECK(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}") != NULL, "%s", hdr);
		CHECK(strstr(hdr, "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}"),
		      "%s", hdr);
		CHECK(strstr(hdr, "\"data_offsets\":[6,18]"), "%s", hdr);
	}
}

/* ---- malformed files ------------------------------------------------------------------------- */

static void test_malformed(void)
{
	static const uint8_t data[64];
	struct sl_weights w;
	const char *p;

	p = P("%s", "short.safetensors");
	write_bytes(p, "\x10\0\0\0\0", 5);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "shorter than the 8-byte");

	p = P("%s", "beyond.safetensors");
	write_st_raw(p, 1000, "{}", NULL, 0);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "goes beyond the end of the file");

	p = P("%s", "absurd.safetensors");
	write_st_raw(p, 1ull << 40, "{}", NULL, 0);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "absurd");

	p = P("%s", "badjson.safetensors");
	write_st(p, "{\"w\": {\"dtype\": \"F32\",", data, 8);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "not valid JSON");

	p = P("%s", "array.safetensors");
	write_st(p, "[1, 2]", data, 8);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "not a JSON object");

	p = P("%s", "dupkey.safetensors");
	write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, 8);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "duplicate");

	p = P("%s", "meta.safetensors");
	write_st(p, "{\"__metadata__\":{\"format\":1}}", data, 0);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "__metadata__.format");

	p = P("%s", "nodtype.safetensors");
	write_st(p, "{\"w.weight\":{\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensor w.weight: dtype");

	p = P("%s", "negshape.safetensors");
	write_st(p, "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
		 data, 4);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensor w.weight: shape[0]");

	p = P("%s", "offsets.safetensors");
	write_st(p, "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 4);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensor w.weight: data_offsets [0, 8] go beyond");

	p = P("%s", "reversed.safetensors");
	write_st(p, "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data,
		 16);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensor w.weight: data_offsets [8, 0] end before");

	p = P("%s", "size.safetensors");
	write_st(p, "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensor w.weight: data_offsets [0, 8] hold 8 bytes, "
		    "but shape [3] of F32 needs 12");

	p = P("%s", "overlap.safetensors");
	write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "tensors a [0, 8] and b [4, 12] overlap");

	/* a tensor inside another one's range overlaps too, even past a third */
	p = P("%s", "overlap2.safetensors");
	write_st(p, "{\"big\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
		 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", data, 16);
	CHECK_FAILS(sl_weights_open_file(&w, p), p, "big [0, 16] and x [4, 8] overlap");

	/* empty tensors and unknown dtypes are fine until used */
	p = P("%s", "ok.safetensors");
	write_st(p, "{\"__metadata__\":{\"format\":\"pt\"},"
		 "\"e\":{\"dtype\":\"F32\",\"shape\":[0, 3],\"data_offsets\":[0,0]},"
		 "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
		 "\"q\":{\"dtype\":\"F4_NEW\",\"shape\":[4],\"data_offsets\":[8,10]}}", data, 10);
	CHECK(sl_weights_open_file(&w, p) == 0);
	CHECK(w.n_tensors == 3);
	CHECK(sl_weights_find(&w, "i") && sl_weights_find(&w, "i")->dtype == SL_DT_OTHER);
	CHECK(sl_weights_find(&w, "e") && sl_weights_find(&w, "e")->numel == 0);
	sl_weights_close(&w);

	p = P("%s", "empty-dir");
	mkdir_p(p);
	CHECK_FAILS(sl_weights_open(&w, p), p, "no model.safetensors or model.safetensors.index.json");
}

/* ---- layouts --------------------------------------------------------------------------------- */

static void test_layout(void)
{
	/* a model dir with a 2x3 matrix, a norm, an unused lm_head, and a BF16 / F16 / I64 tensor */
	static const float w23[6] = { 1, 2, 3, 4, 5, 6 };
	static const uint16_t bf[2] = { 0x3f80, 0xc040 };	/* 1, -3 */
	static const uint16_t hf[2] = { 0x3c00, 0x0001 };	/* 1, 2^-24 */
	static const int64_t i64[2] = { 7, 8 };
	const char *dir = P("%s", "model");
	uint8_t data[6 * 4 + 4 + 4 + 16 + 16];
	struct lay_builder b;
	struct sl_weights w;
	float u0[64], u1[4096], *units[2] = { u0, u1 };
	bool init[32];
	int n_init = -1, n_unused = -1;

	memcpy(data, w23, 24);
	memcpy(data + 24, bf, 4);
	memcpy(data + 28, hf, 4);
	memcpy(data + 32, i64, 16);
	memset(data + 48, 0, 16);
	mkdir_p(dir);
	write_st(P("%s", "model/model.safetensors"),
		 "{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],"
		 "\"data_offsets\":[0,24]},"
		 "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
		 "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F16\",\"shape\":[2],"
		 "\"data_offsets\":[28,32]},"
		 "\"model.layers.0.counter\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[32,48]},"
		 "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[48,64]}}",
		 data, sizeof(data));
	CHECK(sl_weights_open(&w, dir) == 0);
	CHECK(w.n_files == 1 && w.n_tensors == 5);
	for (int i = 1; i < w.n_tensors; i++)
		CHECK(strcmp(w.tensors[i - 1].name, w.tensors[i].name) < 0, "sorted by name");

	/* everything present, plus absent optional tensors of each init kind */
	lay_init(&b, 2);
	lay_add(&b, "model.layers.0.mlp.up_proj.weight", 0, 2, 2, 3, false, SL_INIT_NONE);
	lay_add(&b, "model.layers.0.input_layernorm.weight", 0, 1, 2, 0, false, SL_INIT_ONES);
	lay_add(&b, "model.norm.weight", 0, 1, 2, 0, false, SL_INIT_ONES);
	lay_add(&b, "score.weight", 1, 2, 1, 4000, true, SL_INIT_NORMAL);
	lay_add(&b, "score.norm", 1, 1, 3, 0, true, SL_INIT_ONES);
	lay_add(&b, "score.bias", 1, 1, 2, 0, true, SL_INIT_ZEROS);
	memset(u0, 0xff, sizeof(u0));
	memset(u1, 0xff, sizeof(u1));
	CHECK(sl_weights_load_layout(&w, &b.lay, units, 0.25, 7, init, &n_init, &n_unused) == 0);
	CHECK(!memcmp(u0, w23, sizeof(w23)), "F32 matrix in place");
	CHECK(u0[6] == 1.0f && u0[7] == ldexpf(1.0f, -24), "F16 norm: %g %g", u0[6], u0[7]);
	CHECK(u0[8] == 1.0f && u0[9] == -3.0f, "BF16 norm: %g %g", u0[8], u0[9]);
	CHECK(n_init == 3, "%d initialized", n_init);
	CHECK(n_unused == 2, "lm_head.weight and the counter unused: %d", n_unused);
	CHECK(!init[0] && !init[1] && !init[2] && init[3] && init[4] && init[5]);
	{
		double s = 0, s2 = 0;

		for (int i = 0; i < 4000; i++) {
			s += u1[i];
			s2 += (double)u1[i] * u1[i];
		}
		CHECK_CLOSE(s / 4000, 0.0, 0, 0.02);
		CHECK_CLOSE(sqrt(s2 / 4000), 0.25, 0.05, 0);
	}
	CHECK(u1[4000] == 1 && u1[4001] == 1 && u1[4002] == 1, "ones");
	CHECK(u1[4003] == 0 && u1[4004] == 0, "zeros");
	{
		float first = u1[0];

		/* the same seed initializes the same head */
		CHECK(sl_weights_load_layout(&w, &b.lay, units, 0.25, 7, NULL, NULL, NULL) == 0);
		CHECK(u1[0] == first);
		CHECK(sl_weights_load_layout(&w, &b.lay, units, 0.25, 8, NULL, NULL, NULL) == 0);
		CHECK(u1[0] != first, "another seed, another head");
	}

	/* a required tensor missing: names it and the dir */
	lay_init(&b, 2);
	lay_add(&b, "model.layers.0.mlp.up_proj.weight", 0, 2, 2, 3, false, SL_INIT_NONE);
	lay_add(&b, "model.layers.0.mlp.down_proj.weight", 0, 2, 3, 2, false, SL_INIT_NONE);
	lay_add(&b, "model.layers.0.mlp.gate_proj.weight", 0, 2, 3, 2, false, SL_INIT_NONE);
	CHECK_FAILS(sl_weights_load_layout(&w, &b.lay, units, 0.02, 0, NULL, NULL, NULL), dir,
		    "tensor model.layers.0.mlp.down_proj.weight is missing from the checkpoint "
		    "(and 1 more)");

	/* a wrong shape */
	lay_init(&b, 2);
	lay_add(&b, "model.layers.0.mlp.up_proj.weight", 0, 2, 3, 2, false, SL_INIT_NONE);
	CHECK_FAILS(sl_weights_load_layout(&w, &b.lay, units, 0.02, 0, NULL, NULL, NULL),
		    "model/model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape "
		    "[2, 3], config.json says [3, 2]", "error");
	lay_init(&b, 2);
	lay_add(&b, "model.norm.weight", 0, 2, 1, 2, false, SL_INIT_NONE);
	CHECK_FAILS(sl_weights_load_layout(&w, &b.lay, units, 0.02, 0, NULL, NULL, NULL),
		    "tensor model.norm.weight has shape [2], config.json says [1, 2]", "model");

	/* an unsupported dtype, once used */
	lay_init(&b, 2);
	lay_add(&b, "model.layers.0.counter", 0, 1, 2, 0, false, SL_INIT_NONE);
	CHECK_FAILS(sl_weights_load_layout(&w, &b.lay, units, 0.02, 0, NULL, NULL, NULL),
		    "model/model.safetensors: tensor model.layers.0.counter has dtype I64", "BF16");
	sl_weights_close(&w);
}

/* ---- sharded checkpoints --------------------------------------------------------------------- */

static void test_sharded(void)
{
	static const float a[4] = { 1, 2, 3, 4 }, bb[2] = { 5, 6 }, c[3] = { 7, 8, 9 };
	struct sl_st_out s1[2] = {
		{ .name = "model.a", .ndim = 2, .shape = { 2, 2 }, .data = a },
		{ .name = "model.b", .ndim = 1, .shape = { 2 }, .data = bb },
	};
	struct sl_st_out s2[1] = { { .name = "model.c", .ndim = 1, .shape = { 3 }, .data = c } };
	const char *dir = P("%s", "sharded");
	struct lay_builder b;
	struct sl_weights w;
	float u[16], *units[1] = { u };
	const char *index_ok =
		"{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
		"\"model.a\": \"model-00001-of-00002.safetensors\","
		"\"model.b\": \"model-00001-of-00002.safetensors\","
		"\"model.c\": \"model-00002-of-00002.safetensors\"}}";

	mkdir_p(dir);
	CHECK(sl_st_write(P("%s", "sharded/model-00001-of-00002.safetensors"), s1, 2, SL_DT_F32) == 0);
	CHECK(sl_st_write(P("%s", "sharded/model-00002-of-00002.safetensors"), s2, 1, SL_DT_BF16) == 0);
	write_text(P("%s", "sharded/model.safetensors.index.json"), index_ok);
	CHECK(sl_weights_open(&w, dir) == 0);
	CHECK(w.n_files == 2 && w.n_tensors == 3, "%d files %d tensors", w.n_files, w.n_tensors);
	lay_init(&b, 1);
	lay_add(&b, "model.c", 0, 1, 3, 0, false, SL_INIT_NONE);
	lay_add(&b, "model.a", 0, 2, 2, 2, false, SL_INIT_NONE);
	lay_add(&b, "model.b", 0, 1, 2, 0, false, SL_INIT_NONE);
	CHECK(sl_weights_load_layout(&w, &b.lay, units, 0.02, 0, NULL, NULL, NULL) == 0);
	CHECK(u[0] == 7 && u[1] == 8 && u[2] == 9 && u[3] == 1 && u[6] == 4 && u[7] == 5 &&
	      u[8] == 6);
	sl_weights_close(&w);

	/* the index names a shard that is not there */
	write_text(P("%s", "sharded/model.safetensors.index.json"),
		   "{\"weight_map\": {\"model.a\": \"model-00001-of-00002.safetensors\","
		   "\"model.c\": \"model-00003-of-00003.safetensors\"}}");
	CHECK_FAILS(sl_weights_open(&w, dir), "model.safetensors.index.json",
		    "shard model-00003-of-00003.safetensors (named for tensor model.c) is missing");

	/* the index puts a tensor in a shard that does not hold it */
	write_text(P("%s", "sharded/model.safetensors.index.json"),
		   "{\"weight_map\": {\"model.a\": \"model-00001-of-00002.safetensors\","
		   "\"model.b\": \"model-00001-of-00002.safetensors\","
		   "\"model.c\": \"model-00001-of-00002.safetensors\","
		   "\"model.d\": \"model-00002-of-00002.safetensors\"}}");
	CHECK_FAILS(sl_weights_open(&w, dir), "model.safetensors.index.json",
		    "tensor model.c is listed in shard model-00001-of-00002.safetensors, but it is "
		    "in");
	write_text(P("%s", "sharded/model.safetensors.index.json"),
		   "{\"weight_map\": {\"model.a\": \"model-00001-of-00002.safetensors\","
		   "\"model.b\": \"model-00001-of-00002.safetensors\","
		   "\"model.c\": \"model-00002-of-00002.safetensors\","
		   "\"model.d\": \"model-00002-of-00002.safetensors\"}}");
	CHECK_FAILS(sl_weights_open(&w, dir), "tensor model.d is listed in shard "
		    "model-00002-of-00002.safetensors", "that shard does not hold it");

	/* the same tensor in two shards */
	s2[0].name = "model.b";
	s2[0].shape[0] = 3;
	CHECK(sl_st_write(P("%s", "sharded/model-00002-of-00002.safetensors"), s2, 1, SL_DT_F32) == 0);
	write_text(P("%s", "sharded/model.safetensors.index.json"), index_ok);
	CHECK_FAILS(sl_weights_open(&w, dir), "tensor model.b is in both",
		    "model-00002-of-00002.safetensors");

	/* a shard that is malformed is named */
	write_bytes(P("%s", "sharded/model-00002-of-00002.safetensors"), "abc", 3);
	CHECK_FAILS(sl_weights_open(&w, dir), "model-00002-of-00002.safetensors", "shorter");
}

/* ---- HF cache resolution --------------------------------------------------------------------- */

static void test_resolve(void)
{
	const char *repo = P("%s", "hub/models--Org--Name");
	const char *h1 = "0123456789abcdef0123456789abcdef01234567";
	const char *h2 = "fedcba9876543210fedcba9876543210fedcba98";
	char out[4096], want[4200], p[4200];

	snprintf(p, sizeof(p), "%s/snapshots/%s", repo, h1);
	mkdir_p(p);
	snprintf(p, sizeof(p), "%s/snapshots/%s/config.json", repo, h1);
	write_text(p, "{}");
	snprintf(p, sizeof(p), "%s/snapshots/%s", repo, h2);
	mkdir_p(p);
	snprintf(p, sizeof(p), "%s/snapshots/%s/config.json", repo, h2);
	write_text(p, "{}");
	snprintf(p, sizeof(p), "%s/refs", repo);
	mkdir_p(p);
	snprintf(p, sizeof(p), "%s/refs/main", repo);
	write_text(p, "0123456789abcdef0123456789abcdef01234567");	/* no newline, as hf writes */
	snprintf(p, sizeof(p), "%s/refs/dev", repo);
	write_text(p, "fedcba9876543210fedcba9876543210fedcba98\n");
	snprintf(p, sizeof(p), "%s/refs/gone", repo);
	write_text(p, "1111111111111111111111111111111111111111\n");

	snprintf(want, sizeof(want), "%s/snapshots/%s", repo, h1);
	CHECK(sl_hf_resolve(repo, "", out, sizeof(out)) == 0 && !strcmp(out, want), "%s", out);
	CHECK(sl_hf_resolve(repo, NULL, out, sizeof(out)) == 0 && !strcmp(out, want), "%s", out);
	CHECK(sl_hf_resolve(repo, "main", out, sizeof(out)) == 0 && !strcmp(out, want), "%s", out);
	CHECK(sl_hf_resolve(repo, "0123", out, sizeof(out)) == 0 && !strcmp(out, want), "prefix");
	snprintf(want, sizeof(want), "%s/snapshots/%s", repo, h2);
	CHECK(sl_hf_resolve(repo, "dev", out, sizeof(out)) == 0 && !strcmp(out, want), "ref");
	CHECK(sl_hf_resolve(repo, h2, out, sizeof(out)) == 0 && !strcmp(out, want), "full hash");
	CHECK(sl_hf_resolve(repo, "fedcba98", out, sizeof(out)) == 0 && !strcmp(out, want));

	CHECK_FAILS(sl_hf_resolve(repo, "v2.0", out, sizeof(out)), "revision 'v2.0'", h1);
	CHECK_FAILS(sl_hf_resolve(repo, "v2.0", out, sizeof(out)), "refs/v2.0", h2);
	CHECK_FAILS(sl_hf_resolve(repo, "gone", out, sizeof(out)), "refs/gone names snapshot 1111",
		    "not in snapshots/");
	/* a snapshot still downloading: no config.json */
	snprintf(p, sizeof(p), "%s/snapshots/aaaa", repo);
	mkdir_p(p);
	CHECK_FAILS(sl_hf_resolve(repo, "aaaa", out, sizeof(out)), "snapshots/aaaa",
		    "no config.json");
	/* the hub dir itself: point at a repo */
	CHECK_FAILS(sl_hf_resolve(P("%s", "hub"), "", out, sizeof(out)), "hub cache",
		    "models--Org--Name");
	CHECK_FAILS(sl_hf_resolve(P("%s", "does-not-exist"), "", out, sizeof(out)),
		    "does-not-exist", "no such model dir");

	/* a plain model dir, and a revision given for it */
	snprintf(p, sizeof(p), "%s/snapshots/%s", repo, h1);
	CHECK(sl_hf_resolve(p, "", out, sizeof(out)) == 0 && !strcmp(out, p));
	CHECK_FAILS(sl_hf_resolve(p, "main", out, sizeof(out)), "applies only to Hugging Face cache",
		    h1);
}

/* ---- config.json ----------------------------------------------------------------------------- */

static int load_cfg(struct sl_model_config *mc, const char *text)
{
	const char *p = P("%s", "config.json");

	write_text(p, text);
	return sl_model_config_load(mc, p);
}

#define CFG_BASE                                                                              \
	"\"model_type\": \"qwen3\", \"vocab_size\": 512, \"hidden_size\": 64, "                \
	"\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"intermediate_size\": 128"

static void test_config(void)
{
	struct sl_model_config mc;
	const char *cp = P("%s", "config.json");

	/* a hub-style Qwen3 config; head_dim 32 is not hidden / heads (16) */
	CHECK(load_cfg(&mc, "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": true,"
		       "\"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 32,"
		       "\"hidden_act\": \"silu\", \"hidden_size\": 64, \"initializer_range\": 0.01,"
		       "\"intermediate_size\": 96, \"max_position_embeddings\": 40960,"
		       "\"max_window_layers\": 28, \"model_type\": \"qwen3\","
		       "\"num_attention_heads\": 4, \"num_hidden_layers\": 2,"
		       "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null,"
		       "\"rope_theta\": 1000000, \"sliding_window\": null,"
		       "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
		       "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}")
	      == 0);
	CHECK(!strcmp(mc.model_type, "qwen3") && !strcmp(mc.architecture, "Qwen3ForCausalLM"));
	CHECK(mc.vocab == 151936 && mc.hidden == 64 && mc.n_layers == 2 && mc.n_heads == 4);
	CHECK(mc.n_kv_heads == 2 && mc.head_dim == 32 && mc.intermediate == 96);
	CHECK(mc.max_position == 40960 && mc.rms_eps == 1e-5 && mc.rope_theta == 1e6);
	CHECK(mc.attention_bias && mc.tie_word_embeddings && mc.initializer_range == 0.01);
	CHECK(mc.bos_token_id == 151643 && mc.eos_token_id == 151645 && mc.pad_token_id == -1);
	CHECK(mc.num_labels == 1);
	CHECK(mc.layer_kind && mc.mlp_kind && mc.layer_kind[1] == SL_LAYER_FULL_ATTENTION &&
	      mc.mlp_kind[1] == SL_MLP_DENSE);
	sl_model_config_free(&mc);

	/* newer transformers: rope_parameters; a list of eos ids; id2label gives num_labels */
	CHECK(load_cfg(&mc, "{" CFG_BASE ", \"rope_parameters\": {\"rope_type\": \"default\","
		       "\"rope_theta\": 5000000.0}, \"eos_token_id\": [151645, 151643],"
		       "\"pad_token_id\": null, \"id2label\": {\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"},"
		       "\"num_labels\": 7}") == 0);
	CHECK(mc.rope_theta == 5e6 && mc.eos_token_id == 151645 && mc.pad_token_id == -1);
	CHECK(mc.num_labels == 3, "%d", mc.num_labels);
	sl_model_config_free(&mc);
	CHECK(load_cfg(&mc, "{" CFG_BASE ", \"rope_theta\": 1e6, \"rope_parameters\": {"
		       "\"rope_type\": \"default\", \"rope_theta\": 1000000}, \"num_labels\": 2}")
	      == 0);
	CHECK(mc.rope_theta == 1e6 && mc.num_labels == 2);
	sl_model_config_free(&mc);

	/* defaults, as Qwen3Config has them (head_dim 128 there, not hidden / heads) */
	CHECK(load_cfg(&mc, "{" CFG_BASE "}") == 0);
	CHECK(mc.n_kv_heads == 4 && mc.head_dim == 128 && mc.max_position == 32768);
	CHECK(mc.rms_eps == 1e-6 && mc.rope_theta == 10000 && !mc.attention_bias);
	CHECK(!mc.tie_word_embeddings && mc.initializer_range == 0.02 && mc.num_labels == 1);
	CHECK(mc.pad_token_id == -1 && mc.bos_token_id == -1 && mc.eos_token_id == -1);
	CHECK(mc.architecture[0] == 0 && mc.n_layers == 3 && mc.layer_kind);
	sl_model_config_free(&mc);
	CHECK(load_cfg(&mc, "{" CFG_BASE ", \"num_key_value_heads\": null}") == 0 &&
	      mc.n_kv_heads == 4);
	sl_model_config_free(&mc);

	/* errors name the file and the key */
	CHECK_FAILS(load_cfg(&mc, "{\"model_type\": \"qwen3\", \"hidden_size\": 64,"
			     "\"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
			     "\"intermediate_size\": 128}"), cp, "required key vocab_size is missing");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"num_key_value_heads\": 3}"), cp,
		    "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
	CHECK_FAILS(load_cfg(&mc, "{\"model_type\": \"llama\"}"), cp,
		    "model_type 'llama' is not supported (qwen3, qwen3_moe, qwen3_5, qwen3_5_text, "
		    "qwen3_5_moe, qwen3_5_moe_text)");
	CHECK_FAILS(load_cfg(&mc, "{\"vocab_size\": 5}"), cp, "model_type");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ",\n \"head_dim\": 15}"), cp, "head_dim (15) must be even");
	CHECK_FAILS(load_cfg(&mc, "{\"model_type\": \"qwen3\", \"vocab_size\": 512, "
			     "\"hidden_size\": 0, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
			     "\"intermediate_size\": 128}"), cp, "hidden_size must be positive");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"num_key_value_heads\": \"2\"}"), cp,
		    "key num_key_value_heads must be an integer");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"num_labels\": 1, \"num_labels\": 2}"), cp,
		    "duplicate object key");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ",\n \"rope_theta\": 1e6,\n}"), cp, ":3:");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"rope_parameters\": {\"rope_type\": \"yarn\","
			     "\"rope_theta\": 1e6, \"factor\": 4}}"), cp, "rope_type is 'yarn'");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"rope_theta\": 1e6, \"rope_parameters\": {"
			     "\"rope_type\": \"default\", \"rope_theta\": 1e4}}"), cp, "disagree");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\"}}"),
		    cp, "rope_scaling yarn");
	CHECK_FAILS(load_cfg(&mc, "{" CFG_BASE ", \"use_sliding_window\": true}"), cp,
		    "use_sliding_window");
	CHECK_FAILS(sl_model_config_load(&mc, P("%s", "no-such-config.json")), "no-such-config.json",
		    "cannot read");
}

/* ---- files written by the reference implementation (test/fixtures/st/make_fixtures.py) ---- */

static void test_fixtures(void)
{
	/* the values make_fixtures.py stored, and the bits of their bf16 / f16 roundings by hand */
	static const uint16_t bf16_bits[12] = { 0x3f80, 0xc020, 0x4049, 0x3f80, 0x3f82, 0x4040,
						0x4780, 0x3380, 0x3eab, 0x7f80, 0x8000, 0x3a83 };
	static const float f16_vals[12] = { 1.0f, -2.5f, 3.140625f, 1.00390625f, 1.01171875f, 3.0f,
					    65504.0f, 0x1p-24f, 0.333251953125f, INFINITY, -0.0f,
					    0.00100040435791015625f };
	const struct sl_st_tensor *f32, *bf, *hf;
	struct sl_model_config mc;
	struct sl_weights w;
	char p[4200];
	float x[12], y[12];

	snprintf(p, sizeof(p), "%s", fixture("torch-dtypes.safetensors"));
	CHECK(sl_weights_open_file(&w, p) == 0, "%s", p);
	f32 = sl_weights_find(&w, "m.f32");
	bf = sl_weights_find(&w, "m.bf16");
	hf = sl_weights_find(&w, "m.f16");
	CHECK(f32 && bf && hf && sl_weights_find(&w, "m.i64"));
	if (f32 && bf && hf) {
		CHECK(f32->ndim == 2 && f32->shape[0] == 3 && f32->shape[1] == 4 && f32->numel == 12);
		CHECK(bf->dtype == SL_DT_BF16 && hf->dtype == SL_DT_F16 && bf->numel == 12);
		sl_st_to_f32(f32, x);
		CHECK(x[0] == 1.0f && x[1] == -2.5f && x[3] == 1.00390625f && x[7] == 0x1p-24f);
		for (int i = 0; i < 12; i++) {
			/* torch rounded these; our rounding of the same floats must agree bit for bit */
			CHECK(bits16_at(bf, i) == bf16_bits[i], "[%d] 0x%04x", i, bits16_at(bf, i));
			CHECK(sl_f32_to_bf16(x[i]) == bits16_at(bf, i), "[%d] 0x%04x vs torch 0x%04x", i,
			      sl_f32_to_bf16(x[i]), bits16_at(bf, i));
		}
		sl_st_to_f32(hf, y);
		for (int i = 0; i < 12; i++)
			CHECK(!memcmp(&y[i], &f16_vals[i], 4), "f16[%d] = %.9g, expected %.9g", i,
			      y[i], f16_vals[i]);
	}
	sl_weights_close(&w);

	/* the config.json transformers 5 writes: rope_parameters, layer_types, null token ids */
	snprintf(p, sizeof(p), "%s", fixture("qwen3-cls-config.json"));
	CHECK(sl_model_config_load(&mc, p) == 0, "%s", p);
	CHECK(mc.vocab == 64 && mc.hidden == 32 && mc.n_layers == 2 && mc.n_heads == 4 &&
	      mc.n_kv_heads == 2 && mc.head_dim == 16 && mc.intermediate == 48);
	CHECK(mc.rope_theta == 1e6 && mc.rms_eps == 1e-6 && mc.max_position == 32768);
	CHECK(mc.attention_bias && !mc.tie_word_embeddings && mc.num_labels == 1);
	CHECK(mc.pad_token_id == 0 && mc.bos_token_id == -1 && mc.eos_token_id == -1);
	CHECK(!strcmp(mc.architecture, "Qwen3ForSequenceClassification"));
	sl_model_config_free(&mc);
}

/* ---- mkmodel's output loads back with the layout it implies ----------------------------------- */

static void test_mkmodel(void)
{
	char cmd[16384], p[4200];
	struct sl_model_config mc;
	struct sl_weights w;
	const struct sl_st_tensor *t;
	int rc;

	snprintf(p, sizeof(p), "%s/test/mkmodel", test_builddir());
	if (access(p, X_OK))
		snprintf(p, sizeof(p), "./mkmodel");	/* run by hand in test/ */
	snprintf(cmd, sizeof(cmd), "%s --out %s/mk/m --vocab 32 --hidden 16 --layers 2 --heads 4 "
		 "--kv-heads 2 --head-dim 8 --intermediate 24 --seed 3 --bias --dtype bf16", p, tmp);
	rc = system(cmd);
	CHECK(rc == 0, "%s", cmd);
	if (rc)
		return;
	snprintf(p, sizeof(p), "%s/mk/m/config.json", tmp);
	CHECK(sl_model_config_load(&mc, p) == 0);
	CHECK(mc.hidden == 16 && mc.head_dim == 8 && mc.n_kv_heads == 2 && mc.attention_bias &&
	      !mc.tie_word_embeddings && mc.num_labels == 1 && mc.rope_theta == 1e6 &&
	      mc.pad_token_id == 0 &&
	      !strcmp(mc.architecture, "Qwen3ForSequenceClassification"));
	sl_model_config_free(&mc);
	snprintf(p, sizeof(p), "%s/mk/m", tmp);
	CHECK(sl_weights_open(&w, p) == 0);
	CHECK(w.n_tensors == 1 + 2 * 15 + 1 + 1, "%d tensors", w.n_tensors);
	t = sl_weights_find(&w, "model.layers.1.self_attn.k_proj.weight");
	CHECK(t && t->dtype == SL_DT_BF16 && t->shape[0] == 16 && t->shape[1] == 16);
	t = sl_weights_find(&w, "model.layers.1.self_attn.o_proj.weight");
	CHECK(t && t->shape[0] == 16 && t->shape[1] == 32);
	t = sl_weights_find(&w, "model.layers.0.self_attn.q_norm.weight");
	CHECK(t && t->numel == 8 && bits16_at(t, 0) == 0x3f80 && bits16_at(t, 7) == 0x3f80);
	t = sl_weights_find(&w, "score.weight");
	CHECK(t && t->shape[0] == 1 && t->shape[1] == 16);
	CHECK(sl_weights_find(&w, "lm_head.weight") == NULL);
	sl_weights_close(&w);
}

int main(void)
{
	char cmd[4200];

	sl_log_init();
	snprintf(tmp, sizeof(tmp), "tmp-safetensors-XXXXXX");
	if (!mkdtemp(tmp)) {
		perror("mkdtemp");
		return 1;
	}
	test_conversions();
	test_write_roundtrip();
	test_malformed();
	test_layout();
	test_sharded();
	test_resolve();
	test_config();
	test_fixtures();
	test_mkmodel();

	if (!test_failures) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
		if (system(cmd))
			fprintf(stderr, "could not remove %s\n", tmp);
	}
	return test_exit("test_safetensors");
}
