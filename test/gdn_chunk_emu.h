/*
 * gdn_chunk_emu.h: cuda/gdn_chunk.cuh's kernels, their very source, run on the host: each block's
 * 256 threads as cooperative fibers (ucontext) that run in turn from one barrier to the next, so
 * that the kernels' indexing, tiling, masking and wave logic are checked where no GPU is.  A
 * barrier that some threads of a block skip is reported (it would hang or misbehave on a GPU);
 * the order within a phase is fixed (thread 0 first), so a missing barrier may go unseen.
 * What common.cuh gives the kernels (bf16, bf(), tobf(), block_sum(), quad_sum()) is redefined
 * here.
 * Not compiled on its own: included by test_gdn_chunk.c.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

typedef struct {
	uint16_t x;
} bf16;

static inline float bf(bf16 v)
{
	uint32_t u = (uint32_t)v.x << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static inline bf16 tobf(float f)
{
	uint32_t u;
	bf16 r;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) {
		r.x = 0x7fc0;
		return r;
	}
	u += 0x7fff + ((u >> 16) & 1);	/* round to nearest even */
	r.x = (uint16_t)(u >> 16);
	return r;
}

struct emu_dim {
	unsigned x;
};

#define EMU_T 256			/* threads per block: the kernels' NTH */
#define EMU_STACK (256 << 10)
#define EMU_SM (232448 / 4)		/* the H200's shared memory per block, in floats */

static struct emu_dim threadIdx, blockIdx;
static ucontext_t emu_main, emu_ctx[EMU_T];
static char *emu_stack[EMU_T];
static int emu_cur, emu_done[EMU_T];
static void (*emu_body)(void);
static long emu_divergent;		/* rounds in which some threads ended while others waited */
float emu_sm[EMU_SM];			/* the block's dynamic shared memory */
#ifdef EMU_ASAN
static void *emu_fake[EMU_T], *emu_main_fake;
static const void *emu_main_bottom;
static size_t emu_main_size;
#endif

/* from the running fiber back to the scheduler (a barrier) */
static void emu_sync(void)
{
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(&emu_fake[emu_cur], emu_main_bottom, emu_main_size);
#endif
	swapcontext(&emu_ctx[emu_cur], &emu_main);
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(emu_fake[emu_cur], &emu_main_bottom, &emu_main_size);
#endif
}

/*
 * Exchanges through two buffers used in turn: one barrier each, as a thread can only write a
 * buffer again after the next exchange's barrier, which every reader of this one has passed.
 * Every thread of the block takes part (the kernels shuffle and sum with all threads).
 */
static float emu_xchg[2][EMU_T];
static int emu_par[EMU_T];

static float *emu_put(float v)
{
	float *x = emu_xchg[emu_par[emu_cur]];

	emu_par[emu_cur] ^= 1;
	x[emu_cur] = v;
	emu_sync();
	return x;
}

/* every thread gets the block's sum (a fixed order) */
static float block_sum(float v)
{
	float *x = emu_put(v), s = 0.f;

	for (int i = 0; i < EMU_T; i++)
		s += x[i];
	return s;
}

/* common.cuh's quad_sum: each four threads 4i .. 4i + 3 get (v0 + v1) + (v2 + v3) */
static float quad_sum(float v)
{
	float *x = emu_put(v);
	int q = emu_cur & ~3;

	return (x[q] + x[q + 1]) + (x[q + 2] + x[q + 3]);
}

static void emu_entry(void)
{
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(NULL, &emu_main_bottom, &emu_main_size);
#endif
	emu_body();
	emu_done[emu_cur] = 1;
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(NULL, emu_main_bottom, emu_main_size);
#endif
	/* returning resumes uc_link: the scheduler */
}

/*
 * One block: its threads' contexts, then rounds (each thread to its next barrier) to the end.
 * getcontext() never returns twice here (makecontext sends each context to emu_entry), so
 * -Wclobbered's warning about it is false.
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wclobbered"
static __attribute__((noinline)) void emu_block(int b)
{
	int waiting;

	blockIdx.x = (unsigned)b;
	memset(emu_sm, 0xff, sizeof(emu_sm));	/* NaN: nothing unwritten is read unseen */
	for (int i = 0; i < EMU_T; i++) {
		getcontext(&emu_ctx[i]);
		emu_ctx[i].uc_stack.ss_sp = emu_stack[i];
		emu_ctx[i].uc_stack.ss_size = EMU_STACK;
		emu_ctx[i].uc_link = &emu_main;
		makecontext(&emu_ctx[i], emu_entry, 0);
		emu_done[i] = 0;
		emu_par[i] = 0;
	}
	do {
		int ended = 0;

		waiting = 0;
		for (int i = 0; i < EMU_T; i++) {
			if (emu_done[i])
				continue;
			emu_cur = i;
			threadIdx.x = (unsigned)i;
#ifdef EMU_ASAN
			__sanitizer_start_switch_fiber(&emu_main_fake, emu_stack[i], EMU_STACK);
#endif
			swapcontext(&emu_main, &emu_ctx[i]);
#ifdef EMU_ASAN
			__sanitizer_finish_switch_fiber(emu_main_fake, NULL, NULL);
#endif
			if (emu_done[i])
				ended++;
			else
				waiting++;
		}
		if (ended && waiting)
			emu_divergent++;
	} while (waiting);
}
#pragma GCC diagnostic pop

/*
 * Run body as @blocks blocks of EMU_T threads, one block after the other, with @smem bytes of
 * shared memory: a block that writes past them counts in emu_overrun.
 */
static long emu_overrun;

static void emu_launch(int blocks, size_t smem, void (*body)(void))
{
	emu_body = body;
	for (int i = 0; i < EMU_T; i++)
		if (!emu_stack[i])
			emu_stack[i] = malloc(EMU_STACK);
	for (int b = 0; b < blocks; b++) {
		emu_block(b);
		for (size_t i = smem / 4; i < EMU_SM; i++) {
			uint32_t u;

			memcpy(&u, &emu_sm[i], 4);
			if (u != 0xffffffffu) {
				emu_overrun++;
				break;
			}
		}
	}
}

static void emu_free(void)
{
	for (int i = 0; i < EMU_T; i++) {
		free(emu_stack[i]);
		emu_stack[i] = NULL;
	}
}

/* the CUDA spellings the kernels use */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define sm emu_sm
#define __syncthreads() emu_sync()
#define __syncwarp() emu_sync()

/*
 * Built with -DGDN_EMU_OPERAND_BITS=n, the emulated products round each operand to n mantissa
 * bits (to nearest, ties to even) before multiplying: 10 is the GPU's tf32, 7 would be bf16
 * operands.  Not for the test's verdicts (its bounds are for fp32 operands): for measuring what
 * another operand type would cost, e.g.
 *   make -C test test_gdn_chunk CPPFLAGS=-DGDN_EMU_OPERAND_BITS=7 && test/test_gdn_chunk full
 * (delete test/test_gdn_chunk.o before and after).
 */
#ifdef GDN_EMU_OPERAND_BITS
static inline float emu_operand(float x)
{
	const unsigned drop = 23 - GDN_EMU_OPERAND_BITS;
	unsigned u;

	memcpy(&u, &x, sizeof(u));
	u = (u + (1u << (drop - 1)) - 1 + ((u >> drop) & 1)) & ~((1u << drop) - 1);
	memcpy(&x, &u, sizeof(x));
	return x;
}
#define TC_MM_HOST_OPERAND(x) emu_operand(x)
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#pragma GCC diagnostic ignored "-Wunused-function"
#include "../cuda/gdn_chunk.cuh"
#pragma GCC diagnostic pop

#undef sm
