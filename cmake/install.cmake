# `cmake --install`: the shared library (with its SONAME), the static
# library, the public headers, the ckptio command, a pkg-config file and a
# CMake package exporting ckptio::ckptio (shared) and ckptio::ckptio_static.
include(CMakePackageConfigHelpers)

install(TARGETS ckptio ckptio_static EXPORT ckptioTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ckptio_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

set(CKPTIO_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ckptio)
install(EXPORT ckptioTargets NAMESPACE ckptio:: DESTINATION ${CKPTIO_CMAKE_DIR})
configure_package_config_file(cmake/ckptioConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/ckptioConfig.cmake
                              INSTALL_DESTINATION ${CKPTIO_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ckptioConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ckptioConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ckptioConfigVersion.cmake
        DESTINATION ${CKPTIO_CMAKE_DIR})

# Relocatable: the prefix is found from the .pc file's own place, so
# `cmake --install --prefix DIR` works whatever prefix was configured.
file(RELATIVE_PATH CKPTIO_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(cmake/ckptio.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ckptio.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ckptio.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
