/* Runs one TVM-built aarch64 kernel (a shared object exporting __tvm_ffi_main) on arrays read
 * from files, through tvm-ffi's C calling convention, and writes the last array back.
 *
 *   harness LIB.so N  (PATH DTYPE_CODE BITS NDIM DIM...) x N
 *
 * The kernel's only runtime needs are filled here: a serial TVMBackendParallelLaunch (one task),
 * malloc-backed workspaces, and error reporting. Built with aarch64-linux-gnu-gcc, run under
 * qemu-aarch64. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

typedef struct { void* sync_handle; int32_t num_task; } ParallelEnv;
typedef int (*ParallelLambda)(int task_id, ParallelEnv* penv, void* cdata);

static int serial_launch(ParallelLambda f, void* cdata, int num_task) {
  (void)num_task;
  ParallelEnv env = {NULL, 1};
  return f(0, &env, cdata);
}
static void* alloc_workspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code; (void)bits;
  void* p = NULL;
  return posix_memalign(&p, 64, nbytes ? nbytes : 1) == 0 ? p : NULL;
}
static int free_workspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id;
  free(ptr);
  return 0;
}
/* Called by the kernel's argument checks; exported from this executable (-rdynamic). */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "kernel error %s: ", kind);
  for (int32_t i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}

static void set_ptr(void* lib, const char* name, void* value) {
  void** slot = (void**)dlsym(lib, name);
  if (slot) *slot = value;
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s LIB.so N (PATH CODE BITS NDIM DIM...)xN\n", argv[0]); return 2; }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  set_ptr(lib, "__TVMBackendParallelLaunch", (void*)serial_launch);
  set_ptr(lib, "__TVMBackendAllocWorkspace", (void*)alloc_workspace);
  set_ptr(lib, "__TVMBackendFreeWorkspace", (void*)free_workspace);
  TVMFFISafeCallType fn = (TVMFFISafeCallType)dlsym(lib, "__tvm_ffi_main");
  if (!fn) { fprintf(stderr, "no __tvm_ffi_main in %s\n", argv[1]); return 2; }

  int n = atoi(argv[2]), pos = 3;
  DLTensor* tensors = calloc(n, sizeof(DLTensor));
  TVMFFIAny* args = calloc(n, sizeof(TVMFFIAny));
  const char** paths = calloc(n, sizeof(char*));
  size_t* sizes = calloc(n, sizeof(size_t));
  for (int i = 0; i < n; ++i) {
    paths[i] = argv[pos++];
    DLTensor* t = &tensors[i];
    t->dtype.code = (uint8_t)atoi(argv[pos++]);
    t->dtype.bits = (uint8_t)atoi(argv[pos++]);
    t->dtype.lanes = 1;
    t->ndim = atoi(argv[pos++]);
    t->shape = calloc(t->ndim, sizeof(int64_t));
    size_t count = 1;
    for (int d = 0; d < t->ndim; ++d) { t->shape[d] = atoll(argv[pos++]); count *= t->shape[d]; }
    t->device.device_type = kDLCPU;
    sizes[i] = count * (t->dtype.bits / 8);
    if (posix_memalign(&t->data, 64, sizes[i] ? sizes[i] : 1) != 0) return 3;
    FILE* f = fopen(paths[i], "rb");
    if (!f || fread(t->data, 1, sizes[i], f) != sizes[i]) { fprintf(stderr, "read %s\n", paths[i]); return 3; }
    fclose(f);
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = t;
  }
  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  result.type_index = kTVMFFINone;
  int rc = fn(NULL, args, n, &result);
  if (rc != 0) { fprintf(stderr, "kernel returned %d\n", rc); return 4; }
  FILE* f = fopen(paths[n - 1], "wb");
  if (!f || fwrite(tensors[n - 1].data, 1, sizes[n - 1], f) != sizes[n - 1]) return 5;
  fclose(f);
  return 0;
}
