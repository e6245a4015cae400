/* Whether this machine has the real CUDA stack the library would use: an
 * NVIDIA driver that sees a GPU, a CUDA runtime it would load, and a build
 * of ckptio with the CUDA device. Asked through the driver API, apart from
 * the library, so that the tests that decide on it do not take the answer
 * from the code they test. */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The number of GPUs the driver sees when all of the above holds; else 0,
 * with why (a sentence, NUL-terminated within len) saying what is missing. */
int ckptio_test_real_gpus(char *why, size_t len);

#ifdef __cplusplus
}
#endif
