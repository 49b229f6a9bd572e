/*
 * backend_cuda_q35moe.c: the Qwen3.5-MoE shared expert's gate ops of the cuda backend, included
 * by backend_cuda.c (kernels in cuda/q35moe.cu).
 */

static void cuda_row_gate_fwd(struct sl_backend *be, void *out, const void *y, const void *gate,
			      int T, int H)
{
	sl_cuda_row_gate_fwd(C(be), out, y, gate, T, H);
}

static void cuda_row_gate_bwd(struct sl_backend *be, void *dy, void *dgate, const void *dout,
			      const void *y, const void *gate, int T, int H)
{
	sl_cuda_row_gate_bwd(C(be), dy, dgate, dout, y, gate, T, H);
}

static void cuda_q35moe_init(struct sl_backend *be)
{
	be->row_gate_fwd = cuda_row_gate_fwd;
	be->row_gate_bwd = cuda_row_gate_bwd;
}
