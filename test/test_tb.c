/*
 * test_tb: TensorBoard event files read back by a reader written here from the formats' specs
 * (TFRecord: length, masked CRC-32C of it, data, masked CRC-32C of it; protobuf wire format; the
 * Event / Summary / Value field numbers), with its own bit-by-bit CRC-32C checked against the
 * published check values (RFC 3720 B.4 and the CRC catalogue's "123456789").
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tb.h"
#include "testutil.h"

/* CRC-32C one bit at a time, straight from the polynomial (reflected 0x1EDC6F41) */
static uint32_t ref_crc32c(const unsigned char *p, size_t n)
{
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82f63b78u & -(c & 1));
	}
	return ~c;
}

static uint32_t ref_masked(const unsigned char *p, size_t n)
{
	uint32_t c = ref_crc32c(p, n);

	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const unsigned char *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* protobuf reader: one field at a time from [*p, end) */
struct field {
	unsigned num, wire;
	uint64_t v;			/* varint, fixed64, fixed32 */
	const unsigned char *data;	/* length-delimited */
	size_t len;
};

static int read_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 70 && *p < end; shift += 7) {
		unsigned char b = *(*p)++;

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

static int next_field(const unsigned char **p, const unsigned char *end, struct field *f)
{
	uint64_t key;

	if (*p >= end || read_varint(p, end, &key))
		return -1;
	f->num = key >> 3;
	f->wire = key & 7;
	switch (f->wire) {
	case 0:
		return read_varint(p, end, &f->v);
	case 1:
		if (end - *p < 8)
			return -1;
		f->v = le(*p, 8);
		*p += 8;
		return 0;
	case 5:
		if (end - *p < 4)
			return -1;
		f->v = le(*p, 4);
		*p += 4;
		return 0;
	case 2:
		if (read_varint(p, end, &f->v) || (uint64_t)(end - *p) < f->v)
			return -1;
		f->data = *p;
		f->len = f->v;
		*p += f->len;
		return 0;
	}
	return -1;
}

struct event {
	double wall_time;
	long long step;
	char file_version[64];
	char tag[128];
	float value;
	int nvalues;
};

static int parse_event(const unsigned char *p, size_t n, struct event *e)
{
	const unsigned char *end = p + n;
	struct field f;

	memset(e, 0, sizeof(*e));
	while (p < end) {
		if (next_field(&p, end, &f))
			return -1;
		if (f.num == 1 && f.wire == 1) {
			memcpy(&e->wall_time, &f.v, 8);
		} else if (f.num == 2 && f.wire == 0) {
			e->step = (long long)f.v;
		} else if (f.num == 3 && f.wire == 2) {
			snprintf(e->file_version, sizeof(e->file_version), "%.*s", (int)f.len,
				 f.data);
		} else if (f.num == 5 && f.wire == 2) {
			const unsigned char *s = f.data, *se = f.data + f.len;
			struct field v;

			while (s < se) {	/* Summary: repeated Value value = 1 */
				const unsigned char *q, *qe;
				struct field x;

				if (next_field(&s, se, &v) || v.num != 1 || v.wire != 2)
					return -1;
				e->nvalues++;
				for (q = v.data, qe = v.data + v.len; q < qe;) {
					if (next_field(&q, qe, &x))
						return -1;
					if (x.num == 1 && x.wire == 2) {
						snprintf(e->tag, sizeof(e->tag), "%.*s", (int)x.len,
							 x.data);
					} else if (x.num == 2 && x.wire == 5) {
						uint32_t u = (uint32_t)x.v;

						memcpy(&e->value, &u, 4);
					}
				}
			}
		} else {
			return -1;	/* a field this writer should not produce */
		}
	}
	return 0;
}

static const struct {
	const char *tag;
	long long step;
	double value;
} scalars[] = {
	{ "train/loss", 1, 0.693147 },
	{ "train/lr", 1, 1e-5 },
	{ "train/loss", 2, 0.5 },
	{ "train/grad_norm", 300, -2.25 },
	{ "gpu/peak_memory_gb", 1234567890123LL, 71.234 },	/* a long varint */
};
#define NSCALARS ((int)(sizeof(scalars) / sizeof(scalars[0])))

/* seconds since the epoch on the clock the writer reads (time() may run on a coarser one that
 * is not ordered with it in every sandbox) */
static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void)
{
	char dir[] = "/tmp/sl-tb-XXXXXX", sub[256], path[512] = "", host[256] = "", want[300];
	const unsigned char zeros[32] = { 0 };
	unsigned char *buf = NULL;
	struct sl_tb *tb;
	struct dirent *de;
	size_t size = 0, off = 0;
	double t0 = now() - 1, t1;
	int nrec = 0;
	DIR *d;
	FILE *f;

	/* the reference CRC first, against published check values */
	CHECK(ref_crc32c((const unsigned char *)"123456789", 9) == 0xE3069283u);
	CHECK(ref_crc32c(zeros, 32) == 0x8A9136AAu);
	CHECK(sl_crc32c("123456789", 9) == 0xE3069283u, "%08x", sl_crc32c("123456789", 9));
	CHECK(sl_crc32c(zeros, 32) == 0x8A9136AAu);
	CHECK(sl_crc32c("", 0) == 0);

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(sub, sizeof(sub), "%s/run/tb", dir);
	tb = sl_tb_open(sub);
	CHECK(tb, "sl_tb_open(%s) failed", sub);
	if (!tb)
		return test_exit("test_tb");
	for (int i = 0; i < NSCALARS; i++)
		CHECK(sl_tb_scalar(tb, scalars[i].tag, scalars[i].step, scalars[i].value) == 0);
	CHECK(sl_tb_flush(tb) == 0);
	sl_tb_close(tb);
	t1 = now() + 1;

	gethostname(host, sizeof(host) - 1);
	d = opendir(sub);
	while (d && (de = readdir(d)))
		if (!strncmp(de->d_name, "events.out.tfevents.", 20))
			snprintf(path, sizeof(path), "%s/%s", sub, de->d_name);
	if (d)
		closedir(d);
	CHECK(path[0], "no events.out.tfevents.* in %s", sub);
	snprintf(want, sizeof(want), ".%s", host);
	CHECK(strlen(path) > strlen(want) && !strcmp(path + strlen(path) - strlen(want), want),
	      "%s does not end in the host name", path);
	f = fopen(path, "rb");
	if (f) {
		buf = malloc(1 << 16);
		size = fread(buf, 1, 1 << 16, f);
		fclose(f);
	}
	while (buf && off < size) {
		struct event e;
		uint64_t len;

		if (size - off < 12) {
			CHECK(0, "truncated record header at byte %zu", off);
			break;
		}
		len = le(buf + off, 8);
		CHECK(le(buf + off + 8, 4) == ref_masked(buf + off, 8), "length CRC, record %d", nrec);
		if (size - off - 12 < len + 4) {
			CHECK(0, "truncated record %d", nrec);
			break;
		}
		CHECK(le(buf + off + 12 + len, 4) == ref_masked(buf + off + 12, len),
		      "data CRC, record %d", nrec);
		CHECK(parse_event(buf + off + 12, len, &e) == 0, "record %d is no Event", nrec);
		CHECK(e.wall_time >= t0 && e.wall_time <= t1, "wall_time %f not in [%f, %f]", e.wall_time,
		      t0, t1);
		if (nrec == 0) {
			CHECK(!strcmp(e.file_version, "brain.Event:2"), "file_version '%s'",
			      e.file_version);
			CHECK(e.nvalues == 0);
		} else if (nrec <= NSCALARS) {
			int i = nrec - 1;

			CHECK(e.nvalues == 1 && !strcmp(e.tag, scalars[i].tag), "tag '%s'", e.tag);
			CHECK(e.step == scalars[i].step, "step %lld", e.step);
			CHECK(e.value == (float)scalars[i].value, "value %g", e.value);
			CHECK(!e.file_version[0]);
		}
		off += 12 + len + 4;
		nrec++;
	}
	CHECK(nrec == 1 + NSCALARS, "%d records, expected %d", nrec, 1 + NSCALARS);
	free(buf);

	/* a second writer in the same second gets its own file */
	tb = sl_tb_open(sub);
	CHECK(tb && strcmp(sl_tb_path(tb), path), "second event file %s", sl_tb_path(tb));
	sl_tb_close(tb);

	if (!test_failures) {
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	}
	return test_exit("test_tb");
}
