/* Link-time stub for libcuda.so.1 (CUDA driver API). Built locally because the
   pip-installed CUDA toolkit on the build host has no lib64/stubs/libcuda.so.
   Never loaded at run time: the real driver's libcuda.so.1 provides these. */
#include <cuda.h>
#define STUB return CUDA_ERROR_STUB_LIBRARY
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) { STUB; }
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) { STUB; }
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) { STUB; }
CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) { STUB; }
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) { STUB; }
CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) { STUB; }
CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) { STUB; }
CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) { STUB; }
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) { STUB; }
CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) { STUB; }
CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) { STUB; }
