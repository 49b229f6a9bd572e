/*
 * backend_cpu_q35moe.c: the Qwen3.5-MoE shared expert's per-token sigmoid gate on the cpu
 * backend, included by backend_cpu.c (its float and double builds), after backend_cpu_gdn.c
 * (whose sigm() it uses).  Row sums in double, as the other reductions of this backend.
 */

static void cpu_row_gate_fwd(struct sl_backend *be, void *out, const void *y, const void *gate,
			     int T, int H)
{
	const real *yy = y, *g = gate;
	real *o = out;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		double s = sigm(g[t]);

		for (int h = 0; h < H; h++)
			o[(size_t)t * H + h] += (real)(s * yy[(size_t)t * H + h]);
	}
}

static void cpu_row_gate_bwd(struct sl_backend *be, void *dy, void *dgate, const void *dout,
			     const void *y, const void *gate, int T, int H)
{
	const real *d = dout, *yy = y, *g = gate;
	real *dyy = dy, *dg = dgate;

#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		double s = sigm(g[t]), acc = 0;

		for (int h = 0; h < H; h++) {
			size_t i = (size_t)t * H + h;

			acc += (double)d[i] * yy[i];
			dyy[i] = (real)(s * d[i]);
		}
		dg[t] = (real)(acc * s * (1 - s));
	}
}

static void cpu_q35moe_install(struct sl_backend *be)
{
	be->row_gate_fwd = cpu_row_gate_fwd;
	be->row_gate_bwd = cpu_row_gate_bwd;
}
