# CPack settings for the two Linux packages (scripts/package.sh runs `cpack -G "DEB;TGZ"`).
set(CPACK_PACKAGE_NAME tandem)
set(CPACK_PACKAGE_VENDOR "The Tandem developers")
set(CPACK_PACKAGE_CONTACT "The Tandem developers <maintainers@tandem.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LoRA fine-tuning of huge MoE language models on one machine")
set(CPACK_PACKAGE_DESCRIPTION
    "Tandem fine-tunes Mixture-of-Experts language models (DeepSeek, Kimi-K2,\n"
    "Qwen3-MoE, Mixtral, GGUF files) with LoRA on one workstation: routed experts\n"
    "run on the CPU from host RAM, attention and the dense layers on the GPUs.\n"
    "It ships the tandem command line and the Tandem Studio desktop app.")
string(REPLACE ";" "" CPACK_PACKAGE_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION}")
set(CPACK_PACKAGE_HOMEPAGE_URL "https://tandem.invalid")
set(CPACK_PACKAGE_FILE_NAME "tandem-${PROJECT_VERSION}-linux-x86_64")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_INCLUDE_TOPLEVEL_DIRECTORY ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_THREADS 0)  # all cores for the compressors

# Debian: /usr prefix, Depends: from dpkg-shlibdeps (the bundled libraries resolved in
# the private library dir, never declared), gzip: lintian refuses zstd members and xz took 3 more
# minutes on libtorch (CI packages on every run).
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${CMAKE_INSTALL_PREFIX}/${TANDEM_PRIVATE_LIBDIR}")
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# A CUDA build is the tandem-cuda package: the same files plus libtorch_cuda and the CUDA
# libraries (a few GB), in place of tandem. Only the NVIDIA driver is needed beside it.
if(TANDEM_WITH_CUDA)
  set(CPACK_PACKAGE_NAME tandem-cuda)
  set(CPACK_PACKAGE_FILE_NAME "tandem-cuda-${PROJECT_VERSION}-linux-x86_64")
  set(CPACK_DEBIAN_PACKAGE_PROVIDES tandem)
  set(CPACK_DEBIAN_PACKAGE_CONFLICTS tandem)
  set(CPACK_DEBIAN_PACKAGE_REPLACES tandem)
endif()
include(CPack)
