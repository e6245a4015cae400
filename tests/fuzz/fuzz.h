/* The one entry point every fuzz target defines. libFuzzer calls it in the
 * fuzzing build; replay.c's main calls it over a corpus in the regression
 * build, so both builds compile the same target. */
#ifndef CKPTIO_TESTS_FUZZ_H
#define CKPTIO_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
