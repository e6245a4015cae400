/* NVTX ranges for Nsight Systems (trace.h), through NVIDIA's header-only
 * NVTX v3 (nvtx3/nvToolsExt.h, shipped with the CUDA toolkit): its first
 * call loads the tool named by NVTX_INJECTION64_PATH (dlopen), so nothing
 * is linked and a process without a tool loads nothing. Ranges are pushed
 * only when that variable is set (Nsight Systems sets it): otherwise a span
 * costs trace.h's flag check alone. Built without the header (no toolkit),
 * there are no ranges. */
#include "core/trace.h"

#ifdef CKPTIO_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#include <stdlib.h>

/* The rows of the timeline are grouped under this domain. */
static nvtxDomainHandle_t domain;

int ckptio_nvtx_start(void) {
  const char *tool = getenv("NVTX_INJECTION64_PATH");
  if (!tool || !*tool) return 0;
  domain = nvtxDomainCreateA("ckptio");
  return 1;
}

void ckptio_nvtx_push(const char *name) {
  nvtxEventAttributes_t a = {0};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(domain, &a);
}

void ckptio_nvtx_pop(void) { nvtxDomainRangePop(domain); }

#else

int ckptio_nvtx_start(void) { return 0; }
void ckptio_nvtx_push(const char *name) { (void)name; }
void ckptio_nvtx_pop(void) {}

#endif
