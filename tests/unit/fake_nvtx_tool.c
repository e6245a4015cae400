/* A stand-in for a profiler's NVTX tool (what Nsight Systems names in
 * NVTX_INJECTION64_PATH), for test_trace's TraceNvtx: NVTX's loader calls
 * InitializeInjectionNvtx2, which puts these functions in the table of
 * domain calls. Each call is one line appended to $FAKE_NVTX_LOG:
 * "domain NAME", "TID push NAME", "TID pop". */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int log_fd = -1;
static int domain_tag;

/* One write per line with O_APPEND: lines of several threads never mix. */
static void log_line(const char *line, int n) {
  if (log_fd >= 0 && n > 0) (void)!write(log_fd, line, (size_t)n);
}

static nvtxDomainHandle_t create_domain(const char *name) {
  char line[256];
  log_line(line, snprintf(line, sizeof(line), "domain %s\n", name));
  return (nvtxDomainHandle_t)&domain_tag;
}

static int push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *a) {
  char line[256];
  const char *name = a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?";
  log_line(line, snprintf(line, sizeof(line), "%d push %s%s\n", (int)gettid(), name,
                          domain == (nvtxDomainHandle_t)&domain_tag ? "" : " (another domain)"));
  return 0;
}

static int pop(nvtxDomainHandle_t domain) {
  char line[64];
  log_line(line, snprintf(line, sizeof(line), "%d pop%s\n", (int)gettid(),
                          domain == (nvtxDomainHandle_t)&domain_tag ? "" : " (another domain)"));
  return 0;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const char *path = getenv("FAKE_NVTX_LOG");
  if (path) log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table;
  unsigned n = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &n) || n < NVTX_CBID_CORE2_DomainCreateA)
    return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)create_domain;
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
  *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
  return 1;
}
