/* runtime: the CUDA driver API loaded with dlopen, device memory, modules, launches, CUDA graphs,
 * and the kiln_session API. Prefix rt_.
 *
 * Nothing here links against CUDA: the binary starts (and compiles) on machines without a GPU
 * or driver, and only creating a session needs one. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include "base/base.h"

/* Loads libcuda.so.1 and initialises the driver once per process. KILN_ERR_NO_GPU, with a
 * message saying what is missing, when there is no driver or no device. */
kiln_status rt_driver_init(void);
/* Compute capability of device ordinal `dev` as "sm_XY" (for choosing an arch). */
kiln_status rt_device_arch(int dev, char out[16]);

#endif
