# libtorch comes from the torch wheel in the project venv (scripts/setup.sh makes it).
# Provides the target tandem::torch and the variable TANDEM_WITH_CUDA.
#
# A CUDA wheel's own TorchConfig.cmake insists on a CUDA toolkit. Where there is none (a bare
# Debian machine, CI) we import the CPU half of the wheel by hand, so the same source builds and
# runs on the CPU device; where nvcc is present we use TorchConfig.cmake and build the CUDA parts.

if(NOT TANDEM_PYTHON)
  if(DEFINED ENV{TANDEM_VENV})
    set(_tandem_venv "$ENV{TANDEM_VENV}")
  elseif(DEFINED ENV{XDG_CACHE_HOME})
    set(_tandem_venv "$ENV{XDG_CACHE_HOME}/tandem/venv")
  else()
    set(_tandem_venv "$ENV{HOME}/.cache/tandem/venv")
  endif()
  if(EXISTS "${_tandem_venv}/bin/python")
    set(_tandem_python "${_tandem_venv}/bin/python")
  else()
    find_program(_tandem_python python3 REQUIRED)
  endif()
  set(TANDEM_PYTHON "${_tandem_python}" CACHE FILEPATH
      "Python of the project venv; its torch wheel provides libtorch and the test references")
endif()

execute_process(
  COMMAND "${TANDEM_PYTHON}" -c
    "import os, torch; print(torch.utils.cmake_prefix_path); print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or ''); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _tandem_torch_info RESULT_VARIABLE _tandem_torch_rc ERROR_VARIABLE _tandem_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tandem_torch_rc EQUAL 0)
  message(FATAL_ERROR "No usable torch in ${TANDEM_PYTHON} (${_tandem_torch_err}).\n"
                      "Run scripts/setup.sh, or pass -DTANDEM_PYTHON=/path/to/venv/bin/python.")
endif()
string(REPLACE "\n" ";" _tandem_torch_info "${_tandem_torch_info}")
list(GET _tandem_torch_info 0 TANDEM_TORCH_CMAKE_PREFIX)
list(GET _tandem_torch_info 1 TANDEM_TORCH_DIR)
list(GET _tandem_torch_info 2 Torch_VERSION)
string(REGEX REPLACE "\\+.*$" "" Torch_VERSION "${Torch_VERSION}")  # "2.11.0+cu130" -> "2.11.0", as TorchConfig says
list(GET _tandem_torch_info 3 TANDEM_TORCH_CUDA_VERSION)
list(GET _tandem_torch_info 4 TANDEM_TORCH_CXX11_ABI)

set(_tandem_cuda_default OFF)
if(TANDEM_TORCH_CUDA_VERSION)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(_tandem_cuda_default ON)
  else()
    message(STATUS "torch ${Torch_VERSION} has CUDA ${TANDEM_TORCH_CUDA_VERSION} but no CUDA toolkit "
                   "was found: building for the CPU device only")
  endif()
endif()
option(TANDEM_WITH_CUDA "Build the CUDA parts (needs a CUDA libtorch and the CUDA toolkit)"
       ${_tandem_cuda_default})

add_library(tandem::torch INTERFACE IMPORTED GLOBAL)
# The wheel's libtorch.so exports its own copy of std::filesystem (linked in statically); a binary
# that finds libtorch before libstdc++ binds our std::filesystem calls to that copy, which
# crashes (seen: remove_all). Naming libstdc++ first puts it first in the lookup order.
target_link_libraries(tandem::torch INTERFACE "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state")
if(TANDEM_WITH_CUDA OR NOT TANDEM_TORCH_CUDA_VERSION)
  if(TANDEM_WITH_CUDA)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)  # the static default would link cudart twice
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    # Our .cu files are plain kernels without torch headers; CMake 3.25 cannot give nvcc 13 C++20.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    # Without this, TorchConfig probes the installed GPUs with try_run, which fails on a
    # machine with a toolkit but no driver (CI, build hosts).
    if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
    endif()
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${TANDEM_TORCH_CMAKE_PREFIX}")
  find_package(Torch REQUIRED)
  target_link_libraries(tandem::torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(tandem::torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  separate_arguments(_tandem_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(tandem::torch INTERFACE ${_tandem_torch_flags})
else()
  # The CPU half only: libtorch_cpu and libc10, not the libtorch.so shim, which needs
  # libtorch_cuda (450 MB) and the CUDA libraries behind it. Imported targets, so CMake manages
  # the build-tree RPATH and rewrites it at install time (packaging/ bundles these libraries).
  set(_lib "${TANDEM_TORCH_DIR}/lib")
  foreach(_name torch_cpu c10)
    add_library(tandem::lib${_name} SHARED IMPORTED GLOBAL)
    set_target_properties(tandem::lib${_name} PROPERTIES IMPORTED_LOCATION "${_lib}/lib${_name}.so"
                                                         IMPORTED_SONAME "lib${_name}.so")
    target_link_libraries(tandem::torch INTERFACE tandem::lib${_name})
  endforeach()
  target_include_directories(tandem::torch SYSTEM INTERFACE
    "${TANDEM_TORCH_DIR}/include" "${TANDEM_TORCH_DIR}/include/torch/csrc/api/include")
  target_compile_definitions(tandem::torch INTERFACE
    "_GLIBCXX_USE_CXX11_ABI=${TANDEM_TORCH_CXX11_ABI}")
endif()
if(TANDEM_WITH_CUDA)
  target_compile_definitions(tandem::torch INTERFACE TANDEM_WITH_CUDA=1)
endif()
