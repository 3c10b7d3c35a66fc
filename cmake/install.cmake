# SPDX-License-Identifier: Apache-2.0
# Install rules: libpooler.so (versioned SONAME), the public headers, the tools,
# a CMake package (find_package(pooler) -> pooler::pooler) and a pkg-config file.
include(CMakePackageConfigHelpers)
set(POOLER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pooler)

# What installs is built with its install RUNPATH (the folders of NCCL and
# cuBLAS, absolute), so that CMake neither rewrites it at install nor pads the
# build tree's copy with an empty element (the current directory) to make room
# for that rewrite. None of them links anything of the build tree at run time.
set(POOLER_INSTALLED_TARGETS pooler)
if(POOLER_BUILD_TOOLS)
  list(APPEND POOLER_INSTALLED_TARGETS pooler-cubin pooler-bench pooler-kernel-bench)
endif()
set_target_properties(${POOLER_INSTALLED_TARGETS} PROPERTIES BUILD_WITH_INSTALL_RPATH ON)

install(TARGETS pooler EXPORT poolerTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pooler DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
if(POOLER_BUILD_TOOLS)
  install(TARGETS pooler-cubin pooler-bench pooler-kernel-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          COMPONENT tools)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

install(EXPORT poolerTargets NAMESPACE pooler:: DESTINATION ${POOLER_CMAKE_DIR} COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/poolerConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/poolerConfig.cmake INSTALL_DESTINATION ${POOLER_CMAKE_DIR})
# The C++ API: before 1.0 only the same minor version is compatible. (The binary
# interface is the SONAME's: libpooler.so.N, N = POOLER_ABI_VERSION.)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/poolerConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/poolerConfig.cmake ${PROJECT_BINARY_DIR}/poolerConfigVersion.cmake
        DESTINATION ${POOLER_CMAKE_DIR} COMPONENT development)

# pkg-config: the include folders of cuda.h and nccl.h that pooler.hpp needs.
set(POOLER_PC_CFLAGS "")
foreach(folder IN LISTS CUDAToolkit_INCLUDE_DIRS POOLER_NCCL_INCLUDE)
  if(NOT POOLER_PC_CFLAGS MATCHES "-I${folder}( |$)")
    string(APPEND POOLER_PC_CFLAGS " -I${folder}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/pooler.pc.in ${PROJECT_BINARY_DIR}/pooler.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pooler.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
