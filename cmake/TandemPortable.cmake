# TANDEM_PORTABLE_ONLY: the libraries that need neither Qt, libtorch nor oneDNN, and their unit
# tests. scripts/windows_cross.sh builds this with mingw-w64 (cmake/mingw-w64.cmake) and runs the
# tests under wine, which proves the platform layer (engine/core/platform) on Windows.
#
# Third-party code comes from the build host where Debian ships no mingw build of it: header-only
# nlohmann-json from /usr/include, GoogleTest compiled from /usr/src/googletest (libgtest-dev).
# A library whose dependency is not found for the target (PCRE2, yaml-cpp, SQLite have no mingw
# package in Debian) is left out with a message, with its tests.

set(TANDEM_WITH_CUDA OFF)

# nlohmann-json: the host's headers, copied into the build dir, because a cross compiler must not
# get the host's /usr/include (glibc's headers) on its include path.
find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  find_path(TANDEM_HOST_NLOHMANN_DIR nlohmann/json.hpp PATHS /usr/include NO_DEFAULT_PATH
            NO_CMAKE_FIND_ROOT_PATH)
  if(NOT TANDEM_HOST_NLOHMANN_DIR)
    message(FATAL_ERROR "nlohmann/json.hpp not found: install nlohmann-json3-dev")
  endif()
  file(COPY "${TANDEM_HOST_NLOHMANN_DIR}/nlohmann" DESTINATION "${CMAKE_BINARY_DIR}/host_headers")
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
  target_include_directories(nlohmann_json::nlohmann_json SYSTEM INTERFACE
                             "${CMAKE_BINARY_DIR}/host_headers")
endif()

# GoogleTest, built with the target's compiler from the sources libgtest-dev ships.
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  set(TANDEM_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH "GoogleTest sources (libgtest-dev)")
  if(NOT EXISTS "${TANDEM_GTEST_SOURCE_DIR}/CMakeLists.txt")
    message(FATAL_ERROR "GoogleTest sources not found at ${TANDEM_GTEST_SOURCE_DIR}: install libgtest-dev")
  endif()
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(gtest_disable_pthreads OFF CACHE BOOL "" FORCE)
  add_subdirectory("${TANDEM_GTEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/googletest" EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest)  # googletest >= 1.11 makes these aliases itself
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()

find_package(PCRE2 QUIET)
find_package(yaml-cpp QUIET)
find_package(SQLite3 QUIET)

set(TANDEM_PORTABLE_LEFT_OUT "")
add_subdirectory(engine/core)
add_subdirectory(engine/io)  # without PCRE2: without the tokenizer (engine/io/CMakeLists.txt)
add_subdirectory(engine/experts)
if(SQLite3_FOUND)
  add_subdirectory(engine/store)
else()
  list(APPEND TANDEM_PORTABLE_LEFT_OUT "engine/store (no SQLite for this target)")
endif()
if(yaml-cpp_FOUND AND PCRE2_FOUND)
  add_subdirectory(engine/placement)
else()
  list(APPEND TANDEM_PORTABLE_LEFT_OUT "engine/placement (no yaml-cpp or PCRE2 for this target)")
endif()
if(NOT PCRE2_FOUND)
  list(APPEND TANDEM_PORTABLE_LEFT_OUT "the tokenizer of engine/io and io_tokenizer_test (no PCRE2 for this target)")
endif()
list(APPEND TANDEM_PORTABLE_LEFT_OUT "the oneDNN backend of engine/experts (oneDNN is not in this build)")
foreach(_left ${TANDEM_PORTABLE_LEFT_OUT})
  message(STATUS "Tandem portable build: left out ${_left}")
endforeach()
