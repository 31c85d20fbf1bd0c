# libnuma (Debian: libnuma-dev). Provides Numa::Numa. A plain find_library/find_path rather than
# pkg-config, so a prefix unpacked from .deb files (CMAKE_PREFIX_PATH) works too.
find_path(Numa_INCLUDE_DIR numa.h)
find_library(Numa_LIBRARY numa)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Numa REQUIRED_VARS Numa_LIBRARY Numa_INCLUDE_DIR)
if(Numa_FOUND AND NOT TARGET Numa::Numa)
  add_library(Numa::Numa UNKNOWN IMPORTED)
  set_target_properties(Numa::Numa PROPERTIES IMPORTED_LOCATION "${Numa_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${Numa_INCLUDE_DIR}")
endif()
mark_as_advanced(Numa_INCLUDE_DIR Numa_LIBRARY)
