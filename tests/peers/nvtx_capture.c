/*
 * NVTX injection library for tests: records every domain range of every process it is loaded in.
 *
 * NVTX v3 loads the library named by NVTX_INJECTION64_PATH at the first NVTX call of a process and
 * calls InitializeInjectionNvtx2; we replace the CORE2 (domain API) callbacks with functions that
 * append one line per event to  $NVTX_CAPTURE_DIR/nvtx-<pid>.log  (one file per process; the
 * variable is inherited by spawned children, so every SGLang process writes its own file).
 *
 * Line format (tab separated, one write(2) per line on an O_APPEND descriptor):
 *   kind  pid  tid  t_ns(CLOCK_MONOTONIC)  domain  id  color(hex, "-" if none)  category  payload  message
 * kind: D domain created, P DomainRangePushEx (id = depth after push), O DomainRangePop (id = depth
 * before pop), B DomainRangeStartEx (id = range id), E DomainRangeEnd (id = range id),
 * M DomainMarkEx, S DomainRegisterStringA (id = the domain's count of registered strings, message =
 * the string), C DomainNameCategoryA (id = the category, message = its name). Registered strings
 * (the `nvtx` package's messages) are resolved to their text. category: the event's (0 = none);
 * payload: an int64 payload in decimal, "-" for none, "?<type>" for another payload type.
 */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct { char *name; unsigned long long strings; } capture_domain;

static int out_fd = -1;
static pid_t out_pid = -1;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_range_id = 1;
static __thread int push_depth = 0;

static int output_fd(void) {
    pid_t pid = getpid();
    if (out_fd >= 0 && out_pid == pid) return out_fd;
    pthread_mutex_lock(&out_lock);
    if (out_fd < 0 || out_pid != pid) {
        const char *dir = getenv("NVTX_CAPTURE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/nvtx-%d.log", dir && *dir ? dir : "/tmp", (int)pid);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        /* after a fork the inherited descriptor belongs to the parent's file: never close it here */
        out_fd = fd;
        out_pid = pid;
    }
    pthread_mutex_unlock(&out_lock);
    return out_fd;
}

static const char *domain_name(nvtxDomainHandle_t d) {
    if (d == NULL) return "<default>";
    capture_domain *cd = (capture_domain *)d;
    return cd->name ? cd->name : "<null>";
}

static void clean(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    if (src == NULL) src = "<null>";
    for (; src[i] && i + 1 < cap; i++) dst[i] = (src[i] == '\t' || src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
    dst[i] = 0;
}

static void emit_text(char kind, nvtxDomainHandle_t d, unsigned long long id, const nvtxEventAttributes_t *a,
                      const char *text) {
    char msg[2048], dom[256], color[16], payload[32], line[3072];
    unsigned category = 0;
    strcpy(color, "-");
    strcpy(payload, "-");
    if (a != NULL) {
        if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) text = a->message.ascii;
        else if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) text = (const char *)a->message.registered;
        else if (a->messageType == NVTX_MESSAGE_TYPE_UNICODE) text = "<unicode>";
        if (a->colorType == NVTX_COLOR_ARGB) snprintf(color, sizeof color, "%08x", (unsigned)a->color);
        category = a->category;
        if (a->payloadType == NVTX_PAYLOAD_TYPE_INT64) snprintf(payload, sizeof payload, "%lld", (long long)a->payload.llValue);
        else if (a->payloadType != NVTX_PAYLOAD_UNKNOWN) snprintf(payload, sizeof payload, "?%d", (int)a->payloadType);
    }
    clean(msg, sizeof msg, text);
    clean(dom, sizeof dom, domain_name(d));
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int n = snprintf(line, sizeof line, "%c\t%d\t%ld\t%lld\t%s\t%llu\t%s\t%u\t%s\t%s\n", kind, (int)getpid(),
                     (long)syscall(SYS_gettid), (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, dom, id, color,
                     category, payload, msg);
    int fd = output_fd();
    if (fd >= 0 && n > 0) {
        if (n >= (int)sizeof line) n = (int)sizeof line - 1;
        ssize_t ignored = write(fd, line, (size_t)n);
        (void)ignored;
    }
}

static void emit(char kind, nvtxDomainHandle_t d, unsigned long long id, const nvtxEventAttributes_t *a) {
    emit_text(kind, d, id, a, "");
}

static nvtxDomainHandle_t NVTX_API cap_DomainCreateA(const char *name) {
    capture_domain *cd = (capture_domain *)calloc(1, sizeof *cd);
    cd->name = strdup(name ? name : "");
    emit('D', (nvtxDomainHandle_t)cd, 0, NULL);
    return (nvtxDomainHandle_t)cd;
}

static void NVTX_API cap_DomainDestroy(nvtxDomainHandle_t d) { (void)d; /* handles stay valid: ranges may follow */ }

static nvtxStringHandle_t NVTX_API cap_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s) {
    unsigned long long n = d == NULL ? 0 : __atomic_add_fetch(&((capture_domain *)d)->strings, 1, __ATOMIC_RELAXED);
    emit_text('S', d, n, NULL, s);
    return (nvtxStringHandle_t)strdup(s ? s : "");
}

static void NVTX_API cap_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t category, const char *name) {
    emit_text('C', d, category, NULL, name);
}

static int NVTX_API cap_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    int depth = ++push_depth;
    emit('P', d, (unsigned long long)depth, a);
    return depth - 1;
}

static int NVTX_API cap_DomainRangePop(nvtxDomainHandle_t d) {
    int depth = push_depth;
    emit('O', d, (unsigned long long)(depth < 0 ? 0 : depth), NULL);
    if (push_depth > 0) push_depth--;
    return depth - 1;
}

static nvtxRangeId_t NVTX_API cap_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    uint64_t id = __atomic_fetch_add(&next_range_id, 1, __ATOMIC_RELAXED);
    emit('B', d, (unsigned long long)id, a);
    return (nvtxRangeId_t)id;
}

static void NVTX_API cap_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id) {
    emit('E', d, (unsigned long long)id, NULL);
}

static void NVTX_API cap_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { emit('M', d, 0, a); }

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    if (cb == NULL) return 0;
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == NULL) return 0;
#define HOOK(ID, FN) \
    if ((unsigned)(ID) < size && table[ID] != NULL) *table[ID] = (NvtxFunctionPointer)(FN)
    HOOK(NVTX_CBID_CORE2_DomainCreateA, cap_DomainCreateA);
    HOOK(NVTX_CBID_CORE2_DomainDestroy, cap_DomainDestroy);
    HOOK(NVTX_CBID_CORE2_DomainRegisterStringA, cap_DomainRegisterStringA);
    HOOK(NVTX_CBID_CORE2_DomainNameCategoryA, cap_DomainNameCategoryA);
    HOOK(NVTX_CBID_CORE2_DomainRangePushEx, cap_DomainRangePushEx);
    HOOK(NVTX_CBID_CORE2_DomainRangePop, cap_DomainRangePop);
    HOOK(NVTX_CBID_CORE2_DomainRangeStartEx, cap_DomainRangeStartEx);
    HOOK(NVTX_CBID_CORE2_DomainRangeEnd, cap_DomainRangeEnd);
    HOOK(NVTX_CBID_CORE2_DomainMarkEx, cap_DomainMarkEx);
#undef HOOK
    return 1;
}
