# Cross compiling for 64-bit Windows with Debian's mingw-w64 (g++-mingw-w64-x86-64-posix: the
# POSIX-threads flavour, which std::thread needs). Used by scripts/windows_cross.sh.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(_mingw x86_64-w64-mingw32)

set(CMAKE_C_COMPILER ${_mingw}-gcc-posix)
set(CMAKE_CXX_COMPILER ${_mingw}-g++-posix)
set(CMAKE_RC_COMPILER ${_mingw}-windres)

# Libraries and headers for the target only, never the build host's; programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${_mingw})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Windows x64 aligns the stack to 16 bytes only, and GCC spills 32- and 64-byte vectors with
# aligned moves (GCC bug 54412): the AVX2 / AVX-512 kernels would fault. The assembler turns those
# moves into unaligned ones (binutils >= 2.38).
set(CMAKE_CXX_FLAGS_INIT "-Wa,-muse-unaligned-vector-move")
set(CMAKE_C_FLAGS_INIT "-Wa,-muse-unaligned-vector-move")
# One self-contained .exe per test: no libstdc++/libgcc/winpthread DLLs to find under wine.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

# ctest runs the test programs under wine.
find_program(TANDEM_WINE NAMES wine64 wine PATHS /usr/lib/wine NO_CMAKE_FIND_ROOT_PATH)
if(TANDEM_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${TANDEM_WINE}")
endif()
