// The fake CUDA runtime catches the bugs it exists for: reading a buffer
// before the copy into it finished, touching device memory from the host,
// copying from pageable memory, ignoring errors, unordered streams, leaks,
// the wrong current device and host/device pointer mix-ups.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fake_cudart.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAKE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAKE_UNDER_ASAN 1
#endif
#endif

namespace {

// Two devices unless the environment says otherwise; set before the fake
// reads its environment (on the first CUDA call).
const int kTwoDevices = setenv("FAKE_CUDART_DEVICES", "2", 0);

struct fake_cudart_stats Snap() {
  struct fake_cudart_stats s = FAKE_CUDART_STATS_INIT;
  EXPECT_EQ(0, fake_cudart_stats(&s));
  return s;
}

class Fake : public ::testing::Test {
 protected:
  void SetUp() override {
    // Death tests re-execute the binary: the fake's worker threads make fork alone unsafe.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(0, kTwoDevices);
    ASSERT_EQ(0, fake_cudart_set_fail(nullptr, 0, 0));
    fake_cudart_set_delay_us(2000);
    fake_cudart_reset_stats();
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    (void)cudaGetLastError();
  }
  void TearDown() override {
    fake_cudart_hold(0);
    fake_cudart_set_fail(nullptr, 0, 0);
    fake_cudart_reset_stats();
    EXPECT_EQ(0, fake_cudart_leaks()) << "the test leaked CUDA objects";
  }
};

// ------------------------------------------------------------------ (a)

TEST_F(Fake, AsyncDeviceToHostIsStaleUntilTheEventIsWaitedFor) {
  constexpr size_t n = 1 << 16;
  void *d;
  unsigned char *h;
  cudaStream_t s;
  cudaEvent_t ev;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, n));
  ASSERT_EQ(cudaSuccess, cudaMemset(d, 0x5a, n));  // synchronous
  ASSERT_EQ(cudaSuccess, cudaHostAlloc(reinterpret_cast<void **>(&h), n, cudaHostAllocDefault));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

  // With a delay: the copy is queued, not done. Judged only when this
  // thread ran within half the delay: on a loaded machine it can be off
  // its core longer than that (a CI run saw the copy done). The held copy
  // below checks the same without timing.
  memset(h, 0x11, n);
  fake_cudart_set_delay_us(200000);
  auto queued = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(ev, s));
  unsigned char first = h[0], last = h[n - 1];
  cudaError_t ready = cudaEventQuery(ev);
  if (std::chrono::steady_clock::now() - queued < std::chrono::milliseconds(100)) {
    EXPECT_EQ(0x11, first) << "the bug: reading before the event";
    EXPECT_EQ(0x11, last);
    EXPECT_EQ(cudaErrorNotReady, ready);
  }
  ASSERT_EQ(cudaSuccess, cudaEventSynchronize(ev));
  EXPECT_EQ(cudaSuccess, cudaEventQuery(ev));
  EXPECT_EQ(0x5a, h[0]);
  EXPECT_EQ(0x5a, h[n - 1]);

  // Deterministically, with the copy engine held.
  fake_cudart_set_delay_us(0);
  ASSERT_EQ(cudaSuccess, cudaMemset(d, 0x6b, n));
  fake_cudart_hold(1);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(ev, s));
  EXPECT_EQ(0x5a, h[0]);
  EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(ev));
  fake_cudart_hold(0);
  ASSERT_EQ(cudaSuccess, cudaEventSynchronize(ev));
  EXPECT_EQ(0x6b, h[0]);

  // The mirror bug: refilling a staging buffer before its H2D copy ran
  // puts the new bytes on the device.
  fake_cudart_hold(1);
  memset(h, 0x21, n);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
  memset(h, 0x22, n);  // too early
  fake_cudart_hold(0);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  std::vector<unsigned char> back(n);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0x22, back[0]);

  EXPECT_EQ(cudaSuccess, cudaEventDestroy(ev));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s));
  EXPECT_EQ(cudaSuccess, cudaFreeHost(h));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

// ------------------------------------------------------------------ (b)

TEST_F(Fake, HostDereferenceOfADevicePointerDies) {
  void *d;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, 4096));
  cudaPointerAttributes a;
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, static_cast<char *>(d) + 100));
  EXPECT_EQ(cudaMemoryTypeDevice, a.type);
  EXPECT_EQ(0, a.device);
  volatile unsigned char *p = static_cast<volatile unsigned char *>(d);
#ifdef FAKE_UNDER_ASAN
  // ASan turns the SIGSEGV into a report and exit(1).
  EXPECT_DEATH((void)p[0], "SEGV");
  EXPECT_DEATH(p[4095] = 1, "SEGV");
#else
  EXPECT_EXIT((void)p[0], ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT(p[4095] = 1, ::testing::KilledBySignal(SIGSEGV), "");
#endif
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

// ------------------------------------------------------------------ (c)

TEST_F(Fake, PageableCopiesAreCountedPinnedAndRegisteredAreNot) {
  constexpr size_t n = 1 << 20;
  fake_cudart_set_delay_us(0);
  void *d, *pinned;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, n));
  ASSERT_EQ(cudaSuccess, cudaMallocHost(&pinned, n));
  std::vector<char> pageable(n, 1);
  void *reg = aligned_alloc(4096, n);
  ASSERT_NE(nullptr, reg);
  ASSERT_EQ(cudaSuccess, cudaHostRegister(reg, n, cudaHostRegisterReadOnly));

  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(d, pageable.data(), n, cudaMemcpyHostToDevice, 0));
  EXPECT_EQ(1u, Snap().pageable_copies);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(pinned, d, n, cudaMemcpyDeviceToHost, 0));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(d, static_cast<char *>(reg) + 4096, n - 4096,
                                         cudaMemcpyDefault, 0));
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  struct fake_cudart_stats s = Snap();
  EXPECT_EQ(1u, s.pageable_copies);
  EXPECT_EQ(3u, s.async_copies);
  EXPECT_EQ(2 * n - 4096, s.bytes_h2d);
  EXPECT_EQ(n, s.bytes_d2h);
  EXPECT_EQ(1u, s.pinned_allocs);
  EXPECT_EQ(1u, s.registered_ranges);
  EXPECT_EQ(2 * n, s.peak_locked_bytes);

  cudaPointerAttributes a;
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, pageable.data()));
  EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, static_cast<char *>(pinned) + 5));
  EXPECT_EQ(cudaMemoryTypeHost, a.type);
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, static_cast<char *>(reg) + n - 1));
  EXPECT_EQ(cudaMemoryTypeHost, a.type);

  // A copy that runs past the registered range, and one after unregistering.
  std::vector<char> back(n);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(2u, Snap().pageable_copies);
  ASSERT_EQ(cudaSuccess, cudaHostUnregister(reg));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(reg, d, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(3u, Snap().pageable_copies);
  EXPECT_EQ(0u, Snap().frees_while_busy);

  free(reg);

  // A read-only file mapping registered for H2D, the way loads use it; and
  // memory that is not mapped at all cannot be registered.
  FILE *f = tmpfile();
  ASSERT_NE(nullptr, f);
  ASSERT_EQ(0, ftruncate(fileno(f), n));
  void *map = mmap(nullptr, n, PROT_READ, MAP_SHARED, fileno(f), 0);
  ASSERT_NE(MAP_FAILED, map);
  ASSERT_EQ(cudaSuccess, cudaHostRegister(map, n, cudaHostRegisterReadOnly));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d, map, n, cudaMemcpyHostToDevice));
  EXPECT_EQ(3u, Snap().pageable_copies);
  ASSERT_EQ(cudaSuccess, cudaHostUnregister(map));
  ASSERT_EQ(0, munmap(map, n));
  fclose(f);
  EXPECT_EQ(cudaErrorInvalidValue, cudaHostRegister(map, n, 0)) << "unmapped";
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d, map, n, cudaMemcpyHostToDevice)) << "unmapped";

  EXPECT_EQ(cudaSuccess, cudaFreeHost(pinned));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

// ------------------------------------------------------------------ (d)

TEST_F(Fake, FaultInjectionFailsTheNthCallOnly) {
  fake_cudart_set_delay_us(0);
  void *d;
  std::vector<char> h(256);
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, 256));
  ASSERT_EQ(0, fake_cudart_set_fail("cudaMemcpyAsync", 3, cudaErrorLaunchFailure));
  for (int i = 1; i <= 5; i++)
    EXPECT_EQ(i == 3 ? cudaErrorLaunchFailure : cudaSuccess,
              cudaMemcpyAsync(d, h.data(), 256, cudaMemcpyHostToDevice, 0))
        << "call " << i;
  EXPECT_EQ(5, fake_cudart_calls("cudaMemcpyAsync"));
  EXPECT_EQ(4u, Snap().async_copies);
  EXPECT_EQ(cudaErrorLaunchFailure, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  EXPECT_STREQ("cudaErrorLaunchFailure", cudaGetErrorName(cudaErrorLaunchFailure));
  EXPECT_STREQ("unspecified launch failure", cudaGetErrorString(cudaErrorLaunchFailure));
  EXPECT_STREQ("unrecognized error code", cudaGetErrorName(static_cast<cudaError_t>(12345)));

  // The FAKE_CUDART_FAIL syntax, several rules, nth 0 = every call.
  ASSERT_EQ(0, fake_cudart_set_fail_spec(
                   "cudaMalloc:2:cudaErrorMemoryAllocation,cudaGetDeviceCount:0:35"));
  void *a, *b, *c;
  int count = -1;
  EXPECT_EQ(cudaSuccess, cudaMalloc(&a, 16));
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&b, 16));
  EXPECT_EQ(cudaSuccess, cudaMalloc(&c, 16));
  EXPECT_EQ(cudaErrorInsufficientDriver, cudaGetDeviceCount(&count));
  EXPECT_EQ(cudaErrorInsufficientDriver, cudaGetDeviceCount(&count));
  EXPECT_EQ(-1, count);
  for (const char *bad : {"cudaNope:1:cudaErrorUnknown", "cudaMalloc:x:cudaErrorUnknown",
                          "cudaMalloc:1:cudaErrorBogus", "cudaMalloc:1:cudaErrorUnknown:exec",
                          "cudaMalloc:1", "cudaMalloc:-1:cudaErrorUnknown"})
    EXPECT_EQ(-EINVAL, fake_cudart_set_fail_spec(bad)) << bad;
  EXPECT_EQ(-EINVAL, fake_cudart_set_fail("cudaNope", 1, 1));
  ASSERT_EQ(0, fake_cudart_set_fail(nullptr, 0, 0));
  EXPECT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  EXPECT_EQ(cudaSuccess, cudaFree(a));
  EXPECT_EQ(cudaSuccess, cudaFree(c));

  // A copy that fails when it runs: accepted, nothing copied, the error
  // sticks to the stream, its later events and enqueues, and the device.
  cudaStream_t s;
  cudaEvent_t ev;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&ev, cudaEventDefault));
  ASSERT_EQ(cudaSuccess, cudaMemset(d, 0x42, 256));
  ASSERT_EQ(0, fake_cudart_set_fail_spec("cudaMemcpyAsync_ptsz:1:cudaErrorIllegalAddress:exec"));
  std::fill(h.begin(), h.end(), 0);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(h.data(), d, 256, cudaMemcpyDeviceToHost, s));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(ev, s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaStreamSynchronize(s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaEventSynchronize(ev));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaStreamSynchronize(s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaMemcpyAsync(h.data(), d, 256, cudaMemcpyDefault, s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaDeviceSynchronize());
  EXPECT_EQ(0, h[0]) << "a failed copy must not deliver data";
  EXPECT_EQ(1u, Snap().exec_failures);
  fake_cudart_reset_stats();  // clears the sticky errors
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(s));

  // A failure reported by the sync itself, once, after the work finished.
  ASSERT_EQ(0, fake_cudart_set_fail_spec("cudaStreamSynchronize:1:cudaErrorIllegalAddress"));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(h.data(), d, 256, cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaStreamSynchronize(s));
  EXPECT_EQ(0x42, h[255]);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(s));

  EXPECT_EQ(cudaSuccess, cudaEventDestroy(ev));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

// ------------------------------------------------------------------ (e)

TEST_F(Fake, StreamWaitEventOrdersTwoStreams) {
  constexpr size_t n = 4096;
  fake_cudart_set_delay_us(50000);
  void *d, *scratch;
  unsigned char *in, *out;
  cudaStream_t a, b;
  cudaEvent_t ev;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, n));
  ASSERT_EQ(cudaSuccess, cudaMalloc(&scratch, n));
  ASSERT_EQ(cudaSuccess, cudaMallocHost(reinterpret_cast<void **>(&in), n));
  ASSERT_EQ(cudaSuccess, cudaMallocHost(reinterpret_cast<void **>(&out), n));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

  // Stream a writes d after three slow copies; b reads d after one.
  auto run = [&](unsigned char value, bool wait) {
    EXPECT_EQ(cudaSuccess, cudaMemset(d, 0x33, n));
    memset(in, value, n);
    memset(out, 0, n);
    for (int i = 0; i < 3; i++)
      EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(scratch, in, n, cudaMemcpyHostToDevice, a));
    EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(d, in, n, cudaMemcpyHostToDevice, a));
    EXPECT_EQ(cudaSuccess, cudaEventRecord(ev, a));
    if (wait) {
      EXPECT_EQ(cudaSuccess, cudaStreamWaitEvent(b, ev, 0));
    }
    EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(out, d, n, cudaMemcpyDeviceToHost, b));
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(b));
    unsigned char got = out[n - 1];
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(a));
    return got;
  };
  EXPECT_EQ(0x33, run(0x44, false)) << "without the wait, b reads before a wrote";
  EXPECT_EQ(0x55, run(0x55, true));

  // Waiting on a never-recorded event is a no-op; destroyed handles are refused.
  cudaEvent_t fresh;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&fresh, 0));
  EXPECT_EQ(cudaSuccess, cudaStreamWaitEvent(b, fresh, 0));
  EXPECT_EQ(cudaSuccess, cudaEventSynchronize(fresh));
  EXPECT_EQ(cudaSuccess, cudaEventDestroy(fresh));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(fresh, b));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventDestroy(fresh));

  EXPECT_EQ(cudaSuccess, cudaEventDestroy(ev));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(a));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(b));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaStreamSynchronize(b));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaStreamDestroy(b));
  EXPECT_EQ(cudaSuccess, cudaFreeHost(in));
  EXPECT_EQ(cudaSuccess, cudaFreeHost(out));
  EXPECT_EQ(cudaSuccess, cudaFree(scratch));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

TEST_F(Fake, EventTimingAndFreeWhileBusy) {
  fake_cudart_set_delay_us(20000);
  void *d, *h;
  cudaEvent_t t0, t1;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, 4096));
  ASSERT_EQ(cudaSuccess, cudaMallocHost(&h, 4096));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&t0, 0));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&t1, 0));
  float ms = -1;
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, t0, t1));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(t0, 0));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(h, d, 4096, cudaMemcpyDeviceToHost, 0));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(t1, 0));
  EXPECT_EQ(cudaErrorNotReady, cudaEventElapsedTime(&ms, t0, t1));
  // Freeing the destination while the copy is queued: waits, and is counted.
  EXPECT_EQ(cudaSuccess, cudaFreeHost(h));
  EXPECT_EQ(1u, Snap().frees_while_busy);
  ASSERT_EQ(cudaSuccess, cudaEventSynchronize(t1));
  ASSERT_EQ(cudaSuccess, cudaEventElapsedTime(&ms, t0, t1));
  EXPECT_GE(ms, 15.0f);
  EXPECT_EQ(cudaSuccess, cudaEventDestroy(t0));
  EXPECT_EQ(cudaSuccess, cudaEventDestroy(t1));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
}

// ------------------------------------------------------------------ (f)

TEST_F(Fake, LeakAccountingSeesAPinnedAllocationNotFreed) {
  struct fake_cudart_stats before = Snap();
  void *p, *d;
  cudaStream_t s;
  ASSERT_EQ(cudaSuccess, cudaHostAlloc(&p, 10000, cudaHostAllocPortable));
  struct fake_cudart_stats after = Snap();
  EXPECT_EQ(before.pinned_allocs + 1, after.pinned_allocs);
  EXPECT_EQ(before.pinned_bytes + 10000, after.pinned_bytes);
  EXPECT_GE(after.peak_pinned_bytes, 10000u);
  EXPECT_EQ(1, fake_cudart_leaks());
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, 1000));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, 0));
  EXPECT_EQ(3, fake_cudart_leaks());
  EXPECT_EQ(1u, Snap().streams);
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s));
  EXPECT_EQ(cudaSuccess, cudaFree(d));
  EXPECT_EQ(cudaSuccess, cudaFreeHost(p));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFreeHost(p)) << "double free";
  EXPECT_EQ(0, fake_cudart_leaks());
  EXPECT_EQ(10000u, Snap().peak_pinned_bytes);
}

TEST_F(Fake, LeakAtExitFailsTheProcessWhenAsked) {
  // First thing in the test: the death-test child re-runs the test body from the top.
  EXPECT_EXIT(
      {
        setenv("FAKE_CUDART_REPORT_LEAKS", "1", 1);
        void *q;
        if (cudaMallocHost(&q, 4096) != cudaSuccess) _exit(9);
        exit(0);
      },
      ::testing::ExitedWithCode(3), "leaked pinned allocation");
  EXPECT_EXIT(
      {
        setenv("FAKE_CUDART_REPORT_LEAKS", "1", 1);
        void *q;
        if (cudaMallocHost(&q, 4096) != cudaSuccess || cudaFreeHost(q) != cudaSuccess) _exit(9);
        exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// ------------------------------------------------------------------ (g)

TEST_F(Fake, TwoDevicesWithAPerThreadCurrentDevice) {
  int n = 0, cur = -1;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&n));
  ASSERT_EQ(2, n);
  char bus0[32], bus1[32];
  ASSERT_EQ(cudaSuccess, cudaDeviceGetPCIBusId(bus0, sizeof bus0, 0));
  ASSERT_EQ(cudaSuccess, cudaDeviceGetPCIBusId(bus1, sizeof bus1, 1));
  EXPECT_STREQ("0000:3b:00.0", bus0);
  EXPECT_STRNE(bus0, bus1);
  EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(2));
  EXPECT_EQ(cudaErrorInvalidDevice, cudaDeviceGetPCIBusId(bus1, sizeof bus1, 2));
  // The name is what a report prints: it must say this is not a GPU.
  struct cudaDeviceProp prop;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceProperties(&prop, 1));
  EXPECT_NE(nullptr, strstr(prop.name, "not a GPU")) << prop.name;
  EXPECT_EQ(cudaErrorInvalidDevice, cudaGetDeviceProperties(&prop, 2));

  ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
  void *d1 = nullptr, *d0 = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d1, 4096));
  std::thread t([&] {
    int mine = -1;
    EXPECT_EQ(cudaSuccess, cudaGetDevice(&mine));
    EXPECT_EQ(0, mine) << "a new thread starts on device 0";
    EXPECT_EQ(cudaSuccess, cudaMalloc(&d0, 4096));
    EXPECT_EQ(cudaSuccess, cudaSetDevice(1));  // does not leak into the main thread
  });
  t.join();
  ASSERT_EQ(cudaSuccess, cudaGetDevice(&cur));
  EXPECT_EQ(1, cur);
  cudaPointerAttributes a;
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, d1));
  EXPECT_EQ(1, a.device);
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, d0));
  EXPECT_EQ(0, a.device);

  // Events belong to a device; streams are the current device's.
  cudaEvent_t ev;
  cudaStream_t s1;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&ev, 0));  // device 1
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s1, 0));
  EXPECT_EQ(cudaSuccess, cudaEventRecord(ev, s1));
  ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(ev, 0));
  EXPECT_EQ(cudaSuccess, cudaEventRecord(ev, s1));

  // Peer copy through unified addressing.
  fake_cudart_set_delay_us(0);
  std::vector<unsigned char> h(4096, 0);
  ASSERT_EQ(cudaSuccess, cudaMemset(d0, 0x77, 4096));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d1, d0, 4096, cudaMemcpyDefault));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(h.data(), d1, 4096, cudaMemcpyDefault));
  EXPECT_EQ(0x77, h[4095]);
  EXPECT_EQ(4096u, Snap().bytes_d2d);

  EXPECT_EQ(cudaSuccess, cudaEventDestroy(ev));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s1));
  EXPECT_EQ(cudaSuccess, cudaFree(d1));
  EXPECT_EQ(cudaSuccess, cudaFree(d0));
}

// Runs in a fresh process: the fake reads FAKE_CUDART_DEVICES on its first call.
void NoDeviceChild() {
  setenv("FAKE_CUDART_DEVICES", "0", 1);
  int n = -1;
  int v = 0;
  void *p = nullptr;
  bool ok = cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0 &&
            cudaMalloc(&p, 16) == cudaErrorNoDevice && cudaSetDevice(0) == cudaErrorNoDevice &&
            cudaRuntimeGetVersion(&v) == cudaSuccess && v == 13000 &&
            cudaGetLastError() == cudaErrorNoDevice;
  fputs(ok ? "no device: ok\n" : "no device: wrong\n", stderr);
  exit(ok ? 0 : 1);
}

TEST(FakeNoDevice, DevicesZeroMeansNoDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(NoDeviceChild(), ::testing::ExitedWithCode(0), "no device: ok");
}

// ------------------------------------------------------------------ (h)

TEST_F(Fake, HostAndDevicePointerMixUpsAreInvalidValueNotACrash) {
  constexpr size_t n = 4096;
  fake_cudart_set_delay_us(0);
  void *d, *pinned;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&d, n));
  ASSERT_EQ(cudaSuccess, cudaMallocHost(&pinned, n));
  std::vector<char> h(2 * n);
  char *dc = static_cast<char *>(d);

  const struct {
    void *dst;
    const void *src;
    size_t len;
    cudaMemcpyKind kind;
  } bad[] = {
      {h.data(), pinned, n, cudaMemcpyHostToDevice},    // dst is host
      {d, d, n, cudaMemcpyHostToDevice},                // src is device
      {h.data(), h.data() + n, n, cudaMemcpyDeviceToHost},  // src is host
      {d, d, n, cudaMemcpyDeviceToHost},                // dst is device
      {d, h.data(), n, cudaMemcpyDeviceToDevice},       // src is host
      {h.data(), d, n, cudaMemcpyHostToHost},           // src is device
      {d, h.data(), n + 1, cudaMemcpyHostToDevice},     // past the allocation
      {h.data(), dc + 1, n, cudaMemcpyDefault},         // past the allocation
      {nullptr, d, n, cudaMemcpyDefault},
  };
  for (const auto &c : bad) {
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpyAsync(c.dst, c.src, c.len, c.kind, 0));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(c.dst, c.src, c.len, c.kind));
  }
  EXPECT_EQ(cudaErrorInvalidValue, cudaGetLastError());
  EXPECT_EQ(cudaErrorInvalidMemcpyDirection,
            cudaMemcpy(h.data(), d, n, static_cast<cudaMemcpyKind>(7)));
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemsetAsync(h.data(), 0, n, 0));
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemset(pinned, 0, n));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(h.data()));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(dc + 256));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(pinned));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFreeHost(d));
  EXPECT_EQ(cudaErrorInvalidValue, cudaHostRegister(d, n, 0));
  EXPECT_EQ(cudaErrorHostMemoryAlreadyRegistered, cudaHostRegister(pinned, n, 0));
  EXPECT_EQ(cudaErrorNotSupported, cudaHostRegister(h.data(), n, cudaHostRegisterIoMemory));
  EXPECT_EQ(cudaErrorInvalidValue, cudaHostRegister(h.data(), n, 0x100));
  ASSERT_EQ(cudaSuccess, cudaHostRegister(h.data(), n, cudaHostRegisterPortable));
  EXPECT_EQ(cudaErrorHostMemoryAlreadyRegistered, cudaHostRegister(h.data() + 10, n, 0));
  EXPECT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(h.data() + 10));
  EXPECT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(pinned));
  EXPECT_EQ(cudaSuccess, cudaHostUnregister(h.data()));
  EXPECT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(h.data()));
  EXPECT_EQ(0u, Snap().async_copies) << "nothing rejected was queued";

  // The good cases, kinds given or resolved.
  ASSERT_EQ(cudaSuccess, cudaMemcpy(dc + 96, h.data(), n - 96, cudaMemcpyHostToDevice));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(pinned, d, n, cudaMemcpyDefault));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(h.data(), pinned, n, cudaMemcpyHostToHost));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(d, h.data(), 0, cudaMemcpyDeviceToHost, 0))
      << "an empty copy checks nothing";

  // A freed device pointer is no longer device memory.
  ASSERT_EQ(cudaSuccess, cudaFree(d));
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(d));
  cudaPointerAttributes a;
  ASSERT_EQ(cudaSuccess, cudaPointerGetAttributes(&a, d));
  EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
  EXPECT_EQ(cudaErrorInvalidValue, cudaPointerGetAttributes(nullptr, d));
  void *huge = nullptr;
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&huge, size_t{1} << 50));
  EXPECT_EQ(nullptr, huge);
  EXPECT_EQ(cudaSuccess, cudaFreeHost(pinned));
}

// ------------------------------------------------------------------ loading

TEST_F(Fake, LoadsAsLibcudartSo13AndExportsTheRuntimeNames) {
  // By name: the soname of the loaded fake; by path: the symlink, same file.
  for (const char *name : {"libcudart.so.13", FAKE_CUDART_SO13}) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(nullptr, h) << name << ": " << dlerror();
    EXPECT_EQ(reinterpret_cast<void *>(&fake_cudart_stats), dlsym(h, "fake_cudart_stats")) << name;
    EXPECT_EQ(reinterpret_cast<void *>(&cudaMalloc), dlsym(h, "cudaMalloc")) << name;
    for (const char *sym :
         {"cudaGetDeviceCount", "cudaSetDevice", "cudaGetDevice", "cudaMalloc", "cudaFree",
          "cudaHostAlloc", "cudaFreeHost", "cudaMallocHost", "cudaHostRegister",
          "cudaHostUnregister", "cudaStreamCreateWithFlags", "cudaStreamDestroy",
          "cudaStreamSynchronize", "cudaStreamSynchronize_ptsz", "cudaStreamWaitEvent",
          "cudaStreamWaitEvent_ptsz", "cudaEventCreateWithFlags", "cudaEventDestroy",
          "cudaEventRecord", "cudaEventRecord_ptsz", "cudaEventSynchronize", "cudaEventQuery",
          "cudaEventElapsedTime", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz", "cudaMemcpy",
          "cudaMemcpy_ptds", "cudaMemsetAsync", "cudaMemsetAsync_ptsz", "cudaMemset",
          "cudaMemset_ptds", "cudaDeviceSynchronize", "cudaPointerGetAttributes",
          "cudaGetErrorName", "cudaGetErrorString", "cudaGetLastError", "cudaRuntimeGetVersion",
          "cudaDriverGetVersion", "cudaDeviceGetPCIBusId", "cudaGetDeviceProperties",
          "cudaGetDeviceProperties_v2", "fake_cudart_reset_stats",
          "fake_cudart_set_fail", "fake_cudart_set_fail_spec", "fake_cudart_calls",
          "fake_cudart_set_delay_us", "fake_cudart_hold", "fake_cudart_leaks"})
      EXPECT_NE(nullptr, dlsym(h, sym)) << sym;
    EXPECT_EQ(nullptr, dlsym(h, "fc_enter")) << "internals stay local";
    dlclose(h);
  }
  int v = 0;
  ASSERT_EQ(cudaSuccess, cudaRuntimeGetVersion(&v));
  EXPECT_EQ(13000, v);
  ASSERT_EQ(cudaSuccess, cudaDriverGetVersion(&v));
  EXPECT_GE(v, 13000);
}

}  // namespace
