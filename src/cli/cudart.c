/*
 * The command's own loader of the CUDA runtime (cudart.h): a handful of
 * calls, resolved by name, so the CLI needs neither the CUDA headers nor the
 * library's internals.
 */
#include "cli/cudart.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLI_CUDART_SYMBOLS(X)                                                                 \
  X(GetDeviceCount) X(SetDevice) X(DeviceGetPCIBusId) X(StreamCreateWithFlags) X(StreamDestroy) \
  X(StreamSynchronize) X(MemcpyAsync) X(HostRegister) X(HostUnregister) X(GetErrorName)

static int try_open(cli_cudart *rt, const char *name, char *why, size_t len) {
  if ((rt->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))) return 1;
  size_t used = strlen(why);
  snprintf(why + used, len - used, "%s%s", used ? "; " : "", dlerror());
  return 0;
}

int cli_cudart_open(cli_cudart *rt, char *why, size_t len) {
  memset(rt, 0, sizeof(*rt));
  why[0] = '\0';
  const char *env = getenv("CKPTIO_CUDART");
  if (env && *env ? !try_open(rt, env, why, len)
                  : !try_open(rt, "libcudart.so.13", why, len) && !try_open(rt, "libcudart.so.12", why, len))
    return -1;
#define X(name)                                                              \
  if (!(*(void **)&rt->name = dlsym(rt->handle, "cuda" #name))) {            \
    snprintf(why, len, "the CUDA runtime lacks cuda%s", #name);              \
    cli_cudart_close(rt);                                                    \
    return -1;                                                               \
  }
  CLI_CUDART_SYMBOLS(X)
#undef X
  /* CUDA 12's headers rename the call to _v2; 13 has the plain name only. */
  if (!(*(void **)&rt->GetDeviceProperties = dlsym(rt->handle, "cudaGetDeviceProperties_v2")))
    *(void **)&rt->GetDeviceProperties = dlsym(rt->handle, "cudaGetDeviceProperties");
  struct link_map *lm = NULL;
  const char *file = dlinfo(rt->handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0]
                         ? lm->l_name : env && *env ? env : "libcudart";
  snprintf(rt->file, sizeof(rt->file), "%s", file);
  return 0;
}

void cli_cudart_close(cli_cudart *rt) {
  if (rt->handle) dlclose(rt->handle);
  memset(rt, 0, sizeof(*rt));
}

const char *cli_cudart_gpu_name(const cli_cudart *rt, int ordinal, char *buf, size_t len) {
  snprintf(buf, len, "?");
  /* Larger than any version's cudaDeviceProp (about 1 KiB), which the
   * runtime fills whole. */
  enum { PROP_BYTES = 16384, NAME_BYTES = 256 };
  char *prop = rt->GetDeviceProperties ? calloc(1, PROP_BYTES) : NULL;
  if (prop && rt->GetDeviceProperties(prop, ordinal) == 0 && prop[0]) {
    prop[NAME_BYTES - 1] = '\0';
    snprintf(buf, len, "%s", prop);
  }
  free(prop);
  return buf;
}
