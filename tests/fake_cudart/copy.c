/* Copies and memsets: the pointers are checked against the kind (a host
 * pointer where a device one belongs, or the reverse, is
 * cudaErrorInvalidValue, never a crash), device ranges must lie inside one
 * live allocation, and a copy whose host side is neither pinned nor
 * registered is counted as pageable. The work itself runs on the stream. */
#include "internal.h"

/* Under fc_lock. */
static cudaError_t enqueue_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                struct fc_stream *s, cudaError_t exec_err, uint64_t *ticket) {
  if ((unsigned)kind > (unsigned)cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  *ticket = 0;
  if (n == 0) return fc_stream_sticky(s);
  if (!dst || !src) return cudaErrorInvalidValue;
  int ddev = -1, sdev = -1;
  char *da, *sa;
  int dc = fc_classify(dst, n, &ddev, &da), sc = fc_classify(src, n, &sdev, &sa);
  if (dc == FC_MEM_BAD || sc == FC_MEM_BAD) return cudaErrorInvalidValue;
  int want_d = dc, want_s = sc;  /* cudaMemcpyDefault: whatever they are */
  switch (kind) {
  case cudaMemcpyHostToHost: want_d = FC_MEM_HOST, want_s = FC_MEM_HOST; break;
  case cudaMemcpyHostToDevice: want_d = FC_MEM_DEVICE, want_s = FC_MEM_HOST; break;
  case cudaMemcpyDeviceToHost: want_d = FC_MEM_HOST, want_s = FC_MEM_DEVICE; break;
  case cudaMemcpyDeviceToDevice: want_d = FC_MEM_DEVICE, want_s = FC_MEM_DEVICE; break;
  default: break;
  }
  if (dc != want_d || sc != want_s) return cudaErrorInvalidValue;
  /* Pageable memory must at least be mapped, or the copy engine would crash
   * the process where real CUDA returns an error. */
  int dlocked = dc == FC_MEM_HOST && fc_host_locked(dst, n, sdev);
  int slocked = sc == FC_MEM_HOST && fc_host_locked(src, n, ddev);
  if ((dc == FC_MEM_HOST && !dlocked && !fc_host_mapped(dst, n)) ||
      (sc == FC_MEM_HOST && !slocked && !fc_host_mapped(src, n)))
    return cudaErrorInvalidValue;
  cudaError_t e = fc_stream_push_copy(s, da, sa, 0, n, (uintptr_t)dst, (uintptr_t)src, exec_err,
                                      ticket);
  if (e) return e;
  if (dc == FC_MEM_DEVICE && sc == FC_MEM_DEVICE) {
    fc_st.bytes_d2d += n;
  } else if (dc == FC_MEM_DEVICE) {
    fc_st.bytes_h2d += n;
    fc_st.pageable_copies += !slocked;
  } else if (sc == FC_MEM_DEVICE) {
    fc_st.bytes_d2h += n;
    fc_st.pageable_copies += !dlocked;
  } else {
    fc_st.bytes_h2h += n;
  }
  return cudaSuccess;
}

/* Under fc_lock. */
static cudaError_t enqueue_set(void *dst, int value, size_t n, struct fc_stream *s,
                               cudaError_t exec_err, uint64_t *ticket) {
  *ticket = 0;
  if (n == 0) return fc_stream_sticky(s);
  int dev;
  char *da;
  if (!dst || fc_classify(dst, n, &dev, &da) != FC_MEM_DEVICE) return cudaErrorInvalidValue;
  cudaError_t e = fc_stream_push_copy(s, da, NULL, value, n, (uintptr_t)dst, 0, exec_err, ticket);
  if (!e) fc_st.memsets++;
  return e;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t x = cudaSuccess, e = fc_enter(FC_cudaMemcpyAsync, &x);
  if (e || (e = fc_need_device())) return fc_ret(e);
  struct fc_stream *s;
  uint64_t ticket;
  pthread_mutex_lock(&fc_lock);
  if (!(e = fc_stream_get(stream, &s)) && !(e = enqueue_copy(dst, src, count, kind, s, x, &ticket)))
    fc_st.async_copies++;
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind) {
  cudaError_t x = cudaSuccess, e = fc_enter(FC_cudaMemcpy, &x);
  if (e || (e = fc_need_device())) return fc_ret(e);
  struct fc_stream *s;
  uint64_t ticket;
  pthread_mutex_lock(&fc_lock);
  if (!(e = fc_stream_get(0, &s)) &&
      !(e = enqueue_copy(dst, src, count, kind, s, x, &ticket))) {
    fc_st.sync_copies++;
    fc_stream_wait(s, ticket);
    e = fc_stream_sticky(s);
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  cudaError_t x = cudaSuccess, e = fc_enter(FC_cudaMemsetAsync, &x);
  if (e || (e = fc_need_device())) return fc_ret(e);
  struct fc_stream *s;
  uint64_t ticket;
  pthread_mutex_lock(&fc_lock);
  if (!(e = fc_stream_get(stream, &s))) e = enqueue_set(devPtr, value, count, s, x, &ticket);
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count) {
  cudaError_t x = cudaSuccess, e = fc_enter(FC_cudaMemset, &x);
  if (e || (e = fc_need_device())) return fc_ret(e);
  struct fc_stream *s;
  uint64_t ticket;
  pthread_mutex_lock(&fc_lock);
  if (!(e = fc_stream_get(0, &s)) && !(e = enqueue_set(devPtr, value, count, s, x, &ticket))) {
    fc_stream_wait(s, ticket);
    e = fc_stream_sticky(s);
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}
