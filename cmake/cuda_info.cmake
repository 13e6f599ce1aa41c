# What build_info() reports about the CUDA code in _C (csrc/common/module.cpp): the toolkit that
# built it, the architectures with machine code (SASS) and those with PTX, which the driver
# compiles for a newer GPU. Mirrors the --generate-code flags of CMakeLists.txt.
set(LLMK_CUDA_INFO_DEFS LLMK_CUDA_TOOLKIT="" LLMK_CUDA_SASS="" LLMK_CUDA_PTX="")
if(LLMK_WITH_CUDA)
  set(sass ${LLMK_PLAIN_ARCHS})
  set(ptx)
  if(LLMK_PLAIN_ARCHS)
    list(GET LLMK_PLAIN_ARCHS 0 lowest)
    list(APPEND ptx ${lowest})
  endif()
  foreach(arch ${LLMKERN_CUDA_ARCHS})
    if(arch MATCHES "^[0-9]+[af]$")
      list(APPEND sass ${arch})  # code=sm_NNa alone: no PTX
    endif()
  endforeach()
  if("90" IN_LIST LLMKERN_CUDA_ARCHS AND NOT "90a" IN_LIST LLMKERN_CUDA_ARCHS)
    list(APPEND sass 90a)  # the Hopper kernels' own object library
    list(APPEND ptx 90a)
  endif()
  string(REPLACE ";" "," sass "${sass}")
  string(REPLACE ";" "," ptx "${ptx}")
  set(LLMK_CUDA_INFO_DEFS LLMK_CUDA_TOOLKIT="${CUDAToolkit_VERSION}" LLMK_CUDA_SASS="${sass}"
    LLMK_CUDA_PTX="${ptx}")
endif()
