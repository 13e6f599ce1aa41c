// Binds the glibc symbols that glibc 2.29..2.36 versioned afresh to what glibc 2.28 exports, so a
// module linked against a newer glibc loads on glibc 2.28 (manylinux_2_28). Built into a module
// with LLMKERN_GLIBC_COMPAT=ON (cmake/portable.cmake): the linker renames every reference to a
// symbol named here, also those in static archives (libstdc++, libgcc, cudart_static), to
// __wrap_<symbol> (--wrap), defined below. x86_64 only: the versions and the trampolines are its.
//
// LLMK_PIN(symbol, version): __wrap_<symbol> jumps to <symbol>@<version>, same arguments. Glibc
// keeps those versions for old binaries; on glibc < 2.34 the pthread_/dl/sem_/shm_ ones are in
// libpthread, libdl and librt, which the module lists as needed for that reason. cmake/portable.cmake
// reads the symbol names from the LLMK_PIN and LLMK_OWN lines of this file.
#if defined(__x86_64__) && defined(__linux__)
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMK_STR(x) #x
#define LLMK_PIN(sym, ver)                                                                       \
  __asm__(".symver llmk_old_" #sym ", " #sym "@" LLMK_STR(ver) "\n"                             \
          ".text\n.globl __wrap_" #sym "\n.hidden __wrap_" #sym "\n.type __wrap_" #sym ", @function\n"                    \
          "__wrap_" #sym ":\n  jmp llmk_old_" #sym "@PLT\n.size __wrap_" #sym ", .-__wrap_" #sym "\n");
#define LLMK_OWN(sym)  // a definition of our own below

// pthread_*, sem_*, dl*, shm_* moved from libpthread/libdl/librt into libc at 2.34.
LLMK_PIN(pthread_create, GLIBC_2.2.5)
LLMK_PIN(pthread_join, GLIBC_2.2.5)
LLMK_PIN(pthread_detach, GLIBC_2.2.5)
LLMK_PIN(pthread_once, GLIBC_2.2.5)
LLMK_PIN(pthread_kill, GLIBC_2.2.5)
LLMK_PIN(pthread_key_create, GLIBC_2.2.5)
LLMK_PIN(__pthread_key_create, GLIBC_2.2.5)
LLMK_PIN(pthread_key_delete, GLIBC_2.2.5)
LLMK_PIN(pthread_getspecific, GLIBC_2.2.5)
LLMK_PIN(pthread_setspecific, GLIBC_2.2.5)
LLMK_PIN(pthread_setname_np, GLIBC_2.12)
LLMK_PIN(pthread_mutex_trylock, GLIBC_2.2.5)
LLMK_PIN(pthread_mutexattr_init, GLIBC_2.2.5)
LLMK_PIN(pthread_mutexattr_destroy, GLIBC_2.2.5)
LLMK_PIN(pthread_mutexattr_settype, GLIBC_2.2.5)
LLMK_PIN(pthread_mutexattr_setpshared, GLIBC_2.2.5)
LLMK_PIN(pthread_condattr_setpshared, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_init, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_destroy, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_rdlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_wrlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_tryrdlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_trywrlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_timedrdlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_timedwrlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlock_unlock, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlockattr_init, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlockattr_destroy, GLIBC_2.2.5)
LLMK_PIN(pthread_rwlockattr_setpshared, GLIBC_2.2.5)
LLMK_PIN(pthread_spin_init, GLIBC_2.2.5)
LLMK_PIN(pthread_spin_destroy, GLIBC_2.2.5)
LLMK_PIN(pthread_spin_lock, GLIBC_2.2.5)
LLMK_PIN(pthread_spin_trylock, GLIBC_2.2.5)
LLMK_PIN(pthread_spin_unlock, GLIBC_2.2.5)
LLMK_PIN(sem_init, GLIBC_2.2.5)
LLMK_PIN(sem_destroy, GLIBC_2.2.5)
LLMK_PIN(sem_post, GLIBC_2.2.5)
LLMK_PIN(sem_wait, GLIBC_2.2.5)
LLMK_PIN(sem_trywait, GLIBC_2.2.5)
LLMK_PIN(sem_timedwait, GLIBC_2.2.5)
LLMK_PIN(dlopen, GLIBC_2.2.5)
LLMK_PIN(dlmopen, GLIBC_2.3.4)
LLMK_PIN(dlclose, GLIBC_2.2.5)
LLMK_PIN(dlsym, GLIBC_2.2.5)
LLMK_PIN(dlvsym, GLIBC_2.2.5)
LLMK_PIN(dlerror, GLIBC_2.2.5)
LLMK_PIN(shm_open, GLIBC_2.2.5)
LLMK_PIN(shm_unlink, GLIBC_2.2.5)
// The libm functions that got new versions at 2.29 (no errno wrapper); same arguments and results.
LLMK_PIN(exp, GLIBC_2.2.5)
LLMK_PIN(log, GLIBC_2.2.5)
LLMK_PIN(pow, GLIBC_2.2.5)
LLMK_PIN(exp2, GLIBC_2.2.5)
LLMK_PIN(log2, GLIBC_2.2.5)

// Symbols with no 2.28 version: defined here on what glibc 2.28 has.
#define LLMK_HIDDEN __attribute__((visibility("hidden")))
extern "C" {

// Read by libstdc++ to skip atomic reference counts in a single-threaded process; 0 keeps them.
LLMK_OWN(__libc_single_threaded)
LLMK_HIDDEN char __wrap___libc_single_threaded = 0;

// fstat64 became a function at 2.33; before, the headers turned it into __fxstat64(version, ...).
int llmk_old___fxstat64(int ver, int fd, struct stat64* buf);
__asm__(".symver llmk_old___fxstat64, __fxstat64@GLIBC_2.2.5");
LLMK_OWN(fstat64)
LLMK_HIDDEN int __wrap_fstat64(int fd, struct stat64* buf) { return llmk_old___fxstat64(1, fd, buf); }

// arc4random (2.36; std::random_device's default source): the kernel's random bytes.
LLMK_OWN(arc4random)
LLMK_HIDDEN uint32_t __wrap_arc4random(void) {
  uint32_t v = 0;
  while (getentropy(&v, sizeof v) != 0) {
  }
  return v;
}

// _dl_find_object (2.35): the unwinder's lookup of the loaded object holding a code address; a
// failure here would make every C++ exception terminate the process. The same answer from
// dl_iterate_phdr, which the unwinder used before 2.35 (link map left null: it is not read on x86_64).
struct llmk_find {
  uintptr_t pc;
  struct dl_find_object* out;
  int found;
};

static int llmk_find_cb(struct dl_phdr_info* info, size_t, void* data) {
  llmk_find* f = static_cast<llmk_find*>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  const void* eh = nullptr;
  bool hit = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD) {
      lo = start < lo ? start : lo;
      hi = start + ph.p_memsz > hi ? start + ph.p_memsz : hi;
      hit = hit || (f->pc >= start && f->pc < start + ph.p_memsz);
    } else if (ph.p_type == PT_GNU_EH_FRAME) {
      eh = reinterpret_cast<const void*>(start);
    }
  }
  if (!hit) return 0;
  f->out->dlfo_flags = 0;
  f->out->dlfo_map_start = reinterpret_cast<void*>(lo);
  f->out->dlfo_map_end = reinterpret_cast<void*>(hi);
  f->out->dlfo_link_map = nullptr;
  f->out->dlfo_eh_frame = const_cast<void*>(eh);
  f->found = 1;
  return 1;
}

LLMK_OWN(_dl_find_object)
LLMK_HIDDEN int __wrap__dl_find_object(void* pc, struct dl_find_object* result) {
  llmk_find f{reinterpret_cast<uintptr_t>(pc), result, 0};
  dl_iterate_phdr(llmk_find_cb, &f);
  return f.found ? 0 : -1;
}

}  // extern "C"
#endif
