/*
 * fuzz_common: what every harness shares.  The parsers under test read files, so each input is
 * written to an in-memory file (memfd) and handed over as /proc/self/fd/N: the harness then runs
 * exactly the code path a user's file takes, opening and size checks included.
 */
#ifndef SL_FUZZ_COMMON_H
#define SL_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Writes @size bytes to this process's scratch file (in /dev/shm when it exists) and its path to
 * @path; returns 0, or -1.  A real file, not a memfd: loaders call realpath() on what they open.
 */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t n)
{
	const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	FILE *f;

	snprintf(path, n, "%s/sl-fuzz-%d", dir, (int)getpid());
	f = fopen(path, "wb");
	if (!f)
		return -1;
	if (size && fwrite(data, 1, size, f) != size) {
		fclose(f);
		return -1;
	}
	return fclose(f) ? -1 : 0;
}

#endif
