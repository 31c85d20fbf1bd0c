# PCRE2 (8-bit code units; Debian: libpcre2-dev), for the tokenizer's pre-tokenizer regexes.
# Provides PCRE2::PCRE2. find_path/find_library rather than pkg-config, so a prefix unpacked
# from .deb files (CMAKE_PREFIX_PATH) works too.
find_path(PCRE2_INCLUDE_DIR pcre2.h)
find_library(PCRE2_LIBRARY pcre2-8)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(PCRE2 REQUIRED_VARS PCRE2_LIBRARY PCRE2_INCLUDE_DIR)
if(PCRE2_FOUND AND NOT TARGET PCRE2::PCRE2)
  add_library(PCRE2::PCRE2 UNKNOWN IMPORTED)
  set_target_properties(PCRE2::PCRE2 PROPERTIES IMPORTED_LOCATION "${PCRE2_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
endif()
mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_LIBRARY)
