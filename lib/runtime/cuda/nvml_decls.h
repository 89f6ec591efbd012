// The few NVML types and functions ft uses, declared as NVML's nvml.h declares them (the driver's
// management library, libnvidia-ml.so.1; the CUDA toolkit does not always ship nvml.h, and ft
// never links the library: gpu_usage.cpp opens it at run time). The emulated NVML
// (tests/cuda_emu/nvml_emu.cpp, a test tool) defines these functions for the emulated build.
#pragma once

extern "C" {

typedef struct nvmlDevice_st* nvmlDevice_t;

// NVML's status codes (nvml.h nvmlReturn_enum), those ft or the emulation names.
typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlUtilization_st {
  unsigned int gpu;     // % of the last sample period during which a kernel ran
  unsigned int memory;  // % of it during which device memory was read or written
} nvmlUtilization_t;

typedef struct nvmlMemory_st {
  unsigned long long total;  // installed memory, bytes
  unsigned long long free;
  unsigned long long used;  // allocated by every process, the driver's reservation included
} nvmlMemory_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);

}  // extern "C"
