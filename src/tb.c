/*
 * tb: TensorBoard event files (see tb.h).
 *
 * The Event protobuf is written by hand: four fields and one nested message do not warrant a
 * protobuf library.  CRC-32C is computed here too, with a byte-wise table: Debian 12 packages no
 * C library of it (only a Python module; zlib's crc32 uses another polynomial), and the event
 * files are small, so a faster slicing or SSE4.2 version would buy nothing.
 *
 * Wire format used (field number << 3 | wire type):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 */
#include "sl_build.h"
#include "tb.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct sl_tb {
	char path[4096];
	FILE *f;
};

static uint32_t crc_table[256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;	/* reflected 0x1EDC6F41 */
		crc_table[i] = c;
	}
}

uint32_t sl_crc32c(const void *data, size_t n)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const unsigned char *p = data;
	uint32_t c = 0xffffffffu;

	pthread_once(&once, crc_init);
	while (n--)
		c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
	return c ^ 0xffffffffu;
}

/* TFRecord's mask, so that a CRC over data holding CRCs stays well distributed */
static uint32_t masked_crc(const void *data, size_t n)
{
	uint32_t c = sl_crc32c(data, n);

	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* a growing byte buffer for one message */
struct pb {
	unsigned char b[1024];
	size_t n;
	bool overflow;
};

static void pb_bytes(struct pb *p, const void *d, size_t n)
{
	if (p->n + n > sizeof(p->b)) {
		p->overflow = true;
		return;
	}
	memcpy(p->b + p->n, d, n);
	p->n += n;
}

static void pb_varint(struct pb *p, uint64_t v)
{
	unsigned char b[10];
	size_t n = 0;

	do {
		b[n++] = (v & 0x7f) | (v > 0x7f ? 0x80 : 0);
		v >>= 7;
	} while (v);
	pb_bytes(p, b, n);
}

static void pb_tag(struct pb *p, unsigned field, unsigned wire)
{
	pb_varint(p, (uint64_t)field << 3 | wire);
}

static void pb_le(struct pb *p, uint64_t v, int bytes)
{
	unsigned char b[8];

	for (int i = 0; i < bytes; i++)
		b[i] = v >> (8 * i);
	pb_bytes(p, b, bytes);
}

static void pb_double(struct pb *p, unsigned field, double v)
{
	uint64_t u;

	memcpy(&u, &v, 8);
	pb_tag(p, field, 1);
	pb_le(p, u, 8);
}

static void pb_float(struct pb *p, unsigned field, float v)
{
	uint32_t u;

	memcpy(&u, &v, 4);
	pb_tag(p, field, 5);
	pb_le(p, u, 4);
}

static void pb_len(struct pb *p, unsigned field, const void *d, size_t n)
{
	pb_tag(p, field, 2);
	pb_varint(p, n);
	pb_bytes(p, d, n);
}

static double wall_time(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_record(struct sl_tb *tb, const struct pb *ev)
{
	unsigned char head[12];
	uint32_t crc;

	if (ev->overflow) {
		sl_error("tensorboard: an event for %s is too large (tag too long?)", tb->path);
		return -1;
	}
	for (int i = 0; i < 8; i++)
		head[i] = (uint64_t)ev->n >> (8 * i);
	crc = masked_crc(head, 8);
	for (int i = 0; i < 4; i++)
		head[8 + i] = crc >> (8 * i);
	crc = masked_crc(ev->b, ev->n);
	if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(ev->b, 1, ev->n, tb->f) != ev->n ||
	    putc(crc & 0xff, tb->f) == EOF || putc(crc >> 8 & 0xff, tb->f) == EOF ||
	    putc(crc >> 16 & 0xff, tb->f) == EOF || putc(crc >> 24, tb->f) == EOF) {
		sl_error("tensorboard: cannot write %s: %s", tb->path, strerror(errno));
		return -1;
	}
	return 0;
}

static int make_dirs(const char *dir)
{
	char d[4096];

	snprintf(d, sizeof(d), "%s/", dir);
	for (char *p = d + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(d, 0755) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return 0;
}

struct sl_tb *sl_tb_open(const char *dir)
{
	struct sl_tb *tb = calloc(1, sizeof(*tb));
	char host[256] = "";
	struct pb ev = { .n = 0 };
	long now = (long)time(NULL);
	int fd = -1;

	if (!tb)
		return NULL;
	if (make_dirs(dir)) {
		sl_error("tensorboard: cannot make %s: %s", dir, strerror(errno));
		goto out_free;
	}
	gethostname(host, sizeof(host) - 1);
	/* a second file in the same second (a quick restart) gets a suffix; TensorBoard reads
	 * every file whose name holds "tfevents" */
	for (int k = 0; k < 100 && fd < 0; k++) {
		if (k == 0)
			snprintf(tb->path, sizeof(tb->path), "%s/events.out.tfevents.%ld.%s", dir,
				 now, host);
		else
			snprintf(tb->path, sizeof(tb->path), "%s/events.out.tfevents.%ld.%s.%d",
				 dir, now, host, k);
		fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL, 0644);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0 || !(tb->f = fdopen(fd, "wb"))) {
		sl_error("tensorboard: cannot create %s: %s", tb->path, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out_free;
	}
	pb_double(&ev, 1, wall_time());
	pb_len(&ev, 3, "brain.Event:2", strlen("brain.Event:2"));
	if (write_record(tb, &ev) || sl_tb_flush(tb)) {
		fclose(tb->f);
		goto out_free;
	}
	return tb;
out_free:
	free(tb);
	return NULL;
}

int sl_tb_scalar(struct sl_tb *tb, const char *tag, long long step, double value)
{
	struct pb val = { .n = 0 }, sum = { .n = 0 }, ev = { .n = 0 };

	pb_len(&val, 1, tag, strlen(tag));
	pb_float(&val, 2, (float)value);
	pb_len(&sum, 1, val.b, val.n);
	pb_double(&ev, 1, wall_time());
	pb_tag(&ev, 2, 0);
	pb_varint(&ev, (uint64_t)step);		/* int64: two's complement as a varint */
	pb_len(&ev, 5, sum.b, sum.n);
	ev.overflow |= val.overflow | sum.overflow;
	return write_record(tb, &ev);
}

int sl_tb_flush(struct sl_tb *tb)
{
	if (fflush(tb->f) != 0) {
		sl_error("tensorboard: cannot write %s: %s", tb->path, strerror(errno));
		return -1;
	}
	return 0;
}

void sl_tb_close(struct sl_tb *tb)
{
	if (!tb)
		return;
	if (fclose(tb->f) != 0)
		sl_error("tensorboard: cannot write %s: %s", tb->path, strerror(errno));
	free(tb);
}

const char *sl_tb_path(const struct sl_tb *tb)
{
	return tb ? tb->path : "";
}
