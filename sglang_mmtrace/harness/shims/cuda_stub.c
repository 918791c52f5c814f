/*
 * Stub libcuda.so.1 for the CPU test harness (never shipped with the plugin).
 *
 * The only sgl-kernel build on the registry is a CUDA build; SGLANG_USE_CPU_ENGINE=1 makes
 * SGLang import it at module load, and its extension modules need these CUDA driver symbols to
 * dlopen. Every entry point returns CUDA_ERROR_STUB_LIBRARY (34), so nothing can use a GPU and
 * torch.cuda.is_available() stays False. Out-parameters that callers commonly read on failure
 * are cleared so a caller formatting the error never dereferences garbage.
 */
#include <stddef.h>

#define CUDA_ERROR_STUB_LIBRARY 34

#define STUB(name) \
    int name(void) { return CUDA_ERROR_STUB_LIBRARY; }

STUB(cuPointerGetAttribute)
STUB(cuCtxFromGreenCtx)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuDevResourceGenerateDesc)
STUB(cuDevSmResourceSplitByCount)
STUB(cuDeviceGetDevResource)
STUB(cuDriverGetVersion)
STUB(cuGreenCtxCreate)
STUB(cuGreenCtxDestroy)
STUB(cuGreenCtxGetDevResource)
STUB(cuStreamCreate)
STUB(cuInit)

int cuGetErrorString(int error, const char **p_str) {
    (void)error;
    if (p_str != NULL) {
        *p_str = "CUDA_ERROR_STUB_LIBRARY (sglang_mmtrace CPU harness stub libcuda)";
    }
    return CUDA_ERROR_STUB_LIBRARY;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                        unsigned long long flags, int *symbol_status) {
    (void)symbol;
    (void)cuda_version;
    (void)flags;
    if (pfn != NULL) {
        *pfn = NULL;
    }
    if (symbol_status != NULL) {
        *symbol_status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    }
    return CUDA_ERROR_STUB_LIBRARY;
}
