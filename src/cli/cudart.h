/*
 * The CUDA runtime as the `ckptio` command sees it: loaded at run time the
 * way the library finds it, with the few calls `bench --device cuda:N` makes
 * itself (its own stream, the raw copy limits, pinning its host buffer, the
 * GPU's name). No CUDA header: plain C prototypes, int errors, void * handles.
 */
#ifndef CKPTIO_CLI_CUDART_H
#define CKPTIO_CLI_CUDART_H

#include <stddef.h>

/* cudaMemcpyKind values, fixed by the runtime's ABI. */
enum { CLI_CUDA_H2D = 1, CLI_CUDA_D2H = 2 };

typedef struct cli_cudart {
  void *handle;
  char file[256]; /* the file the runtime was loaded from, or its name */
  int (*GetDeviceCount)(int *n);
  int (*SetDevice)(int ordinal);
  int (*DeviceGetPCIBusId)(char *buf, int len, int ordinal);
  int (*StreamCreateWithFlags)(void **stream, unsigned flags);
  int (*StreamDestroy)(void *stream);
  int (*StreamSynchronize)(void *stream);
  int (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, void *stream);
  int (*HostRegister)(void *p, size_t n, unsigned flags);
  int (*HostUnregister)(void *p);
  const char *(*GetErrorName)(int err);
  /* Optional (NULL when the runtime lacks it): fills a cudaDeviceProp, whose
   * first field is the name, char[256], in every runtime version. */
  int (*GetDeviceProperties)(void *prop, int ordinal);
} cli_cudart;

/* Loads $CKPTIO_CUDART, else libcudart.so.13, else libcudart.so.12 (the
 * library's order, so both use the same instance). @return 0, or -1 with
 * the reason in why. */
int cli_cudart_open(cli_cudart *rt, char *why, size_t len);
/* Unloads. Safe on a zeroed struct. */
void cli_cudart_close(cli_cudart *rt);
/* The runtime's name for a GPU ("NVIDIA H100 80GB HBM3") into buf, or "?"
 * when it cannot say. @return buf. */
const char *cli_cudart_gpu_name(const cli_cudart *rt, int ordinal, char *buf, size_t len);

#endif
