// A stand-in for libnvidia-ml.so.1 with the few functions worker/nvml.cc loads, for tests on
// machines without a driver. Readings are fixed: GPU i is (40 + i)% busy and uses (i + 1) GiB
// of 80 GiB. FERRY_FAKE_NVML_DEVICES sets how many GPUs it shows (default 1);
// FERRY_FAKE_NVML_INIT_FAILS=1 makes nvmlInit_v2 fail as it does without a driver.
#include <cstdlib>
#include <cstring>

namespace {

struct Device {
  unsigned int index;
};
Device g_devices[16];

unsigned int NumDevices() {
  const char* env = std::getenv("FERRY_FAKE_NVML_DEVICES");
  const int n = env ? std::atoi(env) : 1;
  return n < 0 ? 0u : (n > 16 ? 16u : static_cast<unsigned int>(n));
}

}  // namespace

extern "C" {

struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

int nvmlInit_v2() {
  const char* fails = std::getenv("FERRY_FAKE_NVML_INIT_FAILS");
  return fails && std::strcmp(fails, "1") == 0 ? 9 /* NVML_ERROR_DRIVER_NOT_LOADED */ : 0;
}

int nvmlShutdown() { return 0; }

int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = NumDevices();
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= NumDevices()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  g_devices[index].index = index;
  *device = &g_devices[index];
  return 0;
}

int nvmlDeviceGetUtilizationRates(void* device, nvmlUtilization_st* out) {
  const unsigned int i = static_cast<Device*>(device)->index;
  out->gpu = 40 + i;
  out->memory = 10;
  return 0;
}

int nvmlDeviceGetMemoryInfo(void* device, nvmlMemory_st* out) {
  const unsigned long long gib = 1ull << 30;
  const unsigned int i = static_cast<Device*>(device)->index;
  out->total = 80 * gib;
  out->used = (i + 1) * gib;
  out->free = out->total - out->used;
  return 0;
}

}  // extern "C"
