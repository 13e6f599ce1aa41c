# Linking for a wheel that installs on older Linux distributions (manylinux_2_28: glibc 2.28,
# GCC 8's libstdc++). Included by CMakeLists.txt; acts on the targets passed to llmk_portable().
#
# - libstdc++ and libgcc go in statically: the C++ runtime of the build machine's compiler is
#   usually newer than the one of the machine that installs the wheel. The modules exchange no C++
#   objects with other libraries (tensors cross as DLPack capsules), so a private copy is safe.
#   (The manylinux container's gcc-toolset needs no such copy: the release build leaves it off.)
# - LLMKERN_GLIBC_COMPAT pins the glibc symbols that a newer glibc versions afresh (pthread_* moved
#   into libc at 2.34, exp/log/pow at 2.29, ...) to the versions glibc 2.28 exports: see
#   cmake/glibc_compat.cpp. Without it a build on glibc >= 2.29 needs that glibc at run time.
#   Inside a manylinux_2_28 container (glibc 2.28) it has nothing to do and is left off.
option(LLMKERN_STATIC_CXX_RUNTIME "Link libstdc++ and libgcc statically into the extension modules" OFF)
option(LLMKERN_GLIBC_COMPAT "Bind glibc symbols to the versions glibc 2.28 exports (x86_64 Linux)" OFF)

# The symbols to rename: the LLMK_PIN(symbol, ...) and LLMK_OWN(symbol) lines of glibc_compat.cpp.
set(LLMK_GLIBC_COMPAT_SRC ${CMAKE_CURRENT_LIST_DIR}/glibc_compat.cpp)
file(STRINGS ${LLMK_GLIBC_COMPAT_SRC} lines REGEX "^LLMK_(PIN|OWN)\\(")
set(LLMK_GLIBC_WRAPPED)
foreach(line ${lines})
  string(REGEX REPLACE "^LLMK_(PIN|OWN)\\(([A-Za-z0-9_]+).*" "\\2" sym "${line}")
  list(APPEND LLMK_GLIBC_WRAPPED ${sym})
endforeach()

if(LLMKERN_GLIBC_COMPAT)
  # It replaces glibc 2.35's _dl_find_object, whose declaration it takes from the headers.
  include(CheckCXXSourceCompiles)
  check_cxx_source_compiles("#include <features.h>
#if !defined(__x86_64__) || !__GLIBC_PREREQ(2, 35)
#error old
#endif
int main() { return 0; }" LLMK_GLIBC_235_X86_64)
  if(NOT LLMK_GLIBC_235_X86_64)
    message(STATUS "llmkern: LLMKERN_GLIBC_COMPAT has nothing to do here (not x86_64 on glibc >= 2.35); off")
    set(LLMKERN_GLIBC_COMPAT OFF)
  endif()
endif()

function(llmk_portable)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  foreach(target ${ARGN})
    if(LLMKERN_STATIC_CXX_RUNTIME)
      # --exclude-libs: the copy's symbols stay private, or the process's own libstdc++ (loaded
      # by Python or torch) would take over some of them (locale facet ids: number formatting fails).
      target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc "LINKER:--exclude-libs,ALL")
    endif()
    if(LLMKERN_GLIBC_COMPAT)
      target_sources(${target} PRIVATE ${LLMK_GLIBC_COMPAT_SRC})
      # .symver directives do not survive link-time optimisation.
      set_source_files_properties(${LLMK_GLIBC_COMPAT_SRC} TARGET_DIRECTORY ${target} PROPERTIES COMPILE_OPTIONS -fno-lto)
      foreach(sym ${LLMK_GLIBC_WRAPPED})
        target_link_options(${target} PRIVATE "LINKER:--wrap=${sym}")
      endforeach()
      # The pinned versions live in libpthread/libdl/librt on glibc < 2.34: load them with the module.
      target_link_options(${target} PRIVATE "LINKER:--no-as-needed" -l:libpthread.so.0 -l:libdl.so.2 -l:librt.so.1
        "LINKER:--as-needed")
    endif()
  endforeach()
endfunction()
